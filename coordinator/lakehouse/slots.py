"""A topic's data files laid out by slot, so that a consumer instance reads only its shares' part of each.

Every message has a fixed 64-bit hash of its ``keys`` (of its ``msg_id`` when it has none): :func:`key_hash`, the
one a consumer group's shares are cut by (share ``h % shares``, ``coordinator.consumer.group.share_of``). The
checker writes each version's file with its rows in *slots*: slot ``s`` of ``2**bits`` holds the rows whose hash's
low ``bits`` bits, read backwards, are ``s``, one Parquet row group each. Read backwards, so that the slots of one
share are next to each other: share ``r`` of ``2**k`` shares is ``2**(bits-k)`` adjacent slots (one byte range of
the file), or, with more shares than slots, part of one slot. A group whose share count is not a power of two cuts
across every slot and reads the whole file, as before.

Where each slot's row group lies is in the file's ``add`` action (the Delta protocol's ``tags``, which Spark and
delta-rs keep and ignore): the byte ranges of the row groups and of the Parquet footer, so that a reader fetches the
footer and its ranges at once, in one round trip. Nothing else about the table changes: same columns, same
statistics, any reader reads the file whole as before.

Example::

    content, tag = write_by_slot(rows)          # the Parquet file's bytes, and its add action's tags
    index = SlotIndex.parse(tag[SLOTS_TAG], len(content))
    index.ranges_for(index.row_groups_for({3}, 16))   # the byte ranges holding share 3 of 16, footer included
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["MAX_SLOT_BITS", "SLOTS_TAG", "SlotIndex", "key_hash", "parquet_file", "read_row_groups", "slot_bits_for",
           "write_by_slot"]

#: The most slots (row groups) a version's file is cut into: 2**6 = 64, so that a group of up to 64 instances
#: each read their part and no more (with more, a slot holds the rows of several instances).
MAX_SLOT_BITS = 6
#: A slot's row group holds about this many bytes (in memory) at the least: each row group costs the footer about
#: 900 bytes, which a reader of any part fetches whole, so that the footer stays within about 1 % of the data
#: (docs/performance-log.md#consumers-reading-their-share-issue-61-point-4-2026-12-06).
MIN_SLOT_BYTES = 96 * 1024
#: The add action's tag with the file's :class:`SlotIndex`.
SLOTS_TAG = "txcoord.slots"
_MAGIC = b"PAR1"


def key_hash(keys: Optional[str], msg_id: str) -> int:
    """A message's 64-bit hash: of its ``keys``, or of its ``msg_id`` when it has none. The same on every host and
    every run (a consumer group's shares and a topic's slots are cut by it).

    Example::

        key_hash("order-42", "9f2c…") % 16  # 11
    """
    return int.from_bytes(_key_digest(keys, msg_id), "big")


def _key_digest(keys: Optional[str], msg_id: str) -> bytes:
    """The 8 bytes :func:`key_hash` reads, big-endian."""
    return hashlib.blake2b((keys if keys else f"\0{msg_id}").encode(), digest_size=8).digest()


def parquet_file(data: pa.Table) -> bytes:
    """``data`` as one Parquet file, as every writer here encodes one: in memory, snappy, written in one call (half
    the time of writing the file through pyarrow).

    Example::

        files.put("part-0.parquet", parquet_file(rows))
    """
    encoded = pa.BufferOutputStream()
    pq.write_table(data, encoded, compression="snappy")
    return encoded.getvalue().to_pybytes()


def slot_bits_for(data: pa.Table) -> int:
    """How many bits of the hash cut ``data`` into slots (0: one slot, the file as before)."""
    bits = 0
    while bits < MAX_SLOT_BITS and data.nbytes >= MIN_SLOT_BYTES << (bits + 1) and data.num_rows >= 2 << bits:
        bits += 1
    return bits


def write_by_slot(data: pa.Table) -> tuple[bytes, dict[str, str]]:
    """``data`` (with ``keys`` and ``msg_id`` columns) as one Parquet file of a row group per slot, in slot order,
    each slot's rows in their order in ``data``; and the add action's ``tags`` saying where each slot lies (none
    for a version too small to cut).

    Example::

        content, tags = write_by_slot(rows)
    """
    bits = slot_bits_for(data)
    if bits == 0:
        return parquet_file(data), {}
    slots = _slots(data, bits)
    order = pc.sort_indices(pa.table({"slot": slots, "row": pa.array(range(data.num_rows), pa.int64())}),
                            [("slot", "ascending"), ("row", "ascending")])
    ordered, ordered_slots = data.take(order), slots.take(order)
    counts = pc.value_counts(ordered_slots).to_pylist()
    counts.sort(key=lambda entry: entry["values"])
    encoded = pa.BufferOutputStream()
    groups = []
    # No row group statistics: rows in slot order are in no column's order, so they would skip nothing, and they
    # were 40 % of the footer every reader fetches (Delta's file statistics are in the log, as before).
    with pq.ParquetWriter(encoded, data.schema, compression="snappy", write_statistics=False) as writer:
        row = 0
        for entry in counts:
            # Each call writes one whole row group: where the file ends before and after it is where it lies.
            start = encoded.tell() if groups else len(_MAGIC)
            writer.write_table(ordered.slice(row, entry["counts"]), row_group_size=entry["counts"])
            groups.append([entry["values"], start, encoded.tell()])
            row += entry["counts"]
    content = encoded.getvalue().to_pybytes()
    footer_length = int.from_bytes(content[-8:-4], "little")
    index = {"bits": bits, "footer": len(content) - 8 - footer_length, "rowGroups": groups}
    return content, {SLOTS_TAG: json.dumps(index, separators=(",", ":"))}


def _slots(data: pa.Table, bits: int) -> pa.Array:
    """Each row's slot: its hash's low ``bits`` bits (the digest's last byte, big-endian), read backwards."""
    mask = (1 << bits) - 1
    backwards = [_reversed(low & mask, bits) for low in range(256)]
    slots = bytes([backwards[_key_digest(keys, msg_id)[7]]
                   for keys, msg_id in zip(data.column("keys").to_pylist(), data.column("msg_id").to_pylist())])
    return pa.Array.from_buffers(pa.uint8(), len(slots), [None, pa.py_buffer(slots)])


def _reversed(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0


@dataclass(frozen=True)
class SlotIndex:
    """Where each slot of one data file lies (:data:`SLOTS_TAG`): ``bits``, the footer's first byte, and for each
    row group its slot and byte range."""

    bits: int
    size: int
    footer: int
    row_groups: tuple[tuple[int, int, int], ...]

    @classmethod
    def parse(cls, tag: object, size: object) -> Optional["SlotIndex"]:
        """The index a file's tag gives, or ``None`` if it gives none that holds (the tag is untrusted bytes: a
        file without a usable index is read whole).

        Example::

            SlotIndex.parse(add["tags"].get(SLOTS_TAG), add["size"])
        """
        try:
            index = json.loads(tag) if isinstance(tag, str) else None
            bits, footer, groups = index["bits"], index["footer"], index["rowGroups"]
            parsed = tuple((int(slot), int(start), int(end)) for slot, start, end in groups)
            valid = (type(bits) is int and 0 < bits <= MAX_SLOT_BITS and type(size) is int and type(footer) is int
                     and 4 <= footer < size - 8
                     and all(0 <= slot < 1 << bits and 4 <= start < end <= footer for slot, start, end in parsed))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return cls(bits, size, footer, parsed) if valid else None

    def row_groups_for(self, numbers: Iterable[int], shares: int) -> Optional[list[int]]:
        """The row groups holding shares ``numbers`` of ``shares``, or ``None`` when they are every row group (a
        share count that is not a power of two cuts across every slot).

        Example::

            index.row_groups_for({3}, 16)  # [48, 49, 50, 51] of 64 (slots whose first 4 bits, backwards, are 3)
        """
        if shares & (shares - 1):
            return None
        mask = min(shares, 1 << self.bits) - 1
        wanted = {number & mask for number in numbers}
        taken = [position for position, (slot, _, _) in enumerate(self.row_groups)
                 if _reversed(slot, self.bits) & mask in wanted]
        return None if len(taken) == len(self.row_groups) else taken

    def ranges_for(self, row_groups: list[int]) -> list[tuple[int, int]]:
        """The byte ranges (start, end) to read for ``row_groups``: theirs, adjacent ones joined, and the footer's."""
        ranges: list[list[int]] = []
        for position in row_groups:
            _, start, end = self.row_groups[position]
            if ranges and ranges[-1][1] == start:
                ranges[-1][1] = end
            else:
                ranges.append([start, end])
        return [(start, end) for start, end in ranges] + [(self.footer, self.size)]


def read_row_groups(size: int, pieces: Mapping[tuple[int, int], bytes], row_groups: list[int]) -> pa.Table:
    """The rows of ``row_groups`` of a Parquet file of ``size`` bytes, from ``pieces`` of it (byte range → bytes:
    the footer's and the row groups')."""
    whole = bytearray(size)  # zero pages the reader never touches; the pieces are the only bytes read
    for (start, end), data in pieces.items():
        whole[start:end] = data
    return pq.ParquetFile(pa.BufferReader(whole)).read_row_groups(row_groups, use_threads=False)
