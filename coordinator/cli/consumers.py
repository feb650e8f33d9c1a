"""The ``txcoord`` commands for consumer groups (no JVM): :func:`register` adds them to the command line.

::

    txcoord add-consumer-group GROUP --topics T [T ...] [--shares N] [--account consumer:GROUP=ACCOUNT]
    txcoord consumer-groups describe GROUP                             # position, lag, instances, retries, dead letters
    txcoord consumer-groups reset GROUP --topic T --to earliest|latest|TIME|OFFSET   # with every instance stopped
    txcoord dead-letters list GROUP
    txcoord dead-letters redrive GROUP (--msg-id ID ... | --all) [--reason TEXT]
    txcoord dead-letters discard GROUP (--msg-id ID ... | --all) [--reason TEXT]

Each action is recorded with who did it (``consumers/<group>/operator_actions``). Exit codes as every
``txcoord`` command's: 0 done, 1 failed, 2 bad arguments or refused.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from coordinator.cli import output
from coordinator.cli.administration import grant_options, print_grants_of
from coordinator.cli.options import EXIT_OK, common_options
from coordinator.config import EXIT_USAGE, CoordinatorConfig
from coordinator.durations import format_duration
from coordinator.exceptions import ConsumerStateError, InvalidArgumentError

__all__ = ["register"]



def register(commands: argparse._SubParsersAction) -> None:
    """Add the consumer-group commands to ``txcoord``'s subcommands.

    Example::

        register(parser.add_subparsers(dest="command"))
    """
    add = commands.add_parser("add-consumer-group", help="grant a consumer group the topics it may read (and print "
                                                         "the grants to give its principal)")
    add.add_argument("group", metavar="GROUP")
    add.add_argument("--topics", nargs="+", required=True, metavar="T",
                     help="topic names or shell-style patterns (ORDER_*); replaces the group's earlier grant")
    add.add_argument("--shares", type=int, default=None,
                     help="how many shares each topic is split into: the most instances that share a topic's work "
                          "(default 16; fixed once the group has progress)")
    grant_options(add)
    common_options(add)
    add.set_defaults(run=run_add_consumer_group)

    groups = commands.add_parser("consumer-groups", help="describe a consumer group, or reset its position")
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")
    describe = actions.add_parser("describe", help="per topic: position, lag, retries; live instances; dead letters")
    describe.add_argument("group", metavar="GROUP")
    common_options(describe)
    describe.set_defaults(run=run_describe, command="consumer-groups describe")
    reset = actions.add_parser("reset", help="move a stopped group's position in a topic")
    reset.add_argument("group", metavar="GROUP")
    reset.add_argument("--topic", required=True, metavar="T")
    reset.add_argument("--to", required=True, metavar="WHERE",
                       help="earliest, latest, an ISO time with its zone, or a queue offset")
    common_options(reset)
    reset.set_defaults(run=run_reset, command="consumer-groups reset")

    dead = commands.add_parser("dead-letters", help="list, redrive or discard a consumer group's dead letters")
    verbs = dead.add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = verbs.add_parser("list", help="the open dead letters, oldest first")
    listed.add_argument("group", metavar="GROUP")
    common_options(listed)
    listed.set_defaults(run=run_dead_letters_list, command="dead-letters list")
    for verb, text in (("redrive", "deliver them to the group's listener again, attempts counted afresh"),
                       ("discard", "close them for good")):
        command = verbs.add_parser(verb, help=text)
        command.add_argument("group", metavar="GROUP")
        chosen = command.add_mutually_exclusive_group(required=True)
        chosen.add_argument("--msg-id", action="append", dest="msg_ids", metavar="ID", help="repeatable")
        chosen.add_argument("--all", action="store_true", help="every open dead letter of the group")
        command.add_argument("--reason", default="", help="why, for the record")
        common_options(command)
        command.set_defaults(run=run_dead_letters_act, verb=verb, command=f"dead-letters {verb}")


def run_add_consumer_group(args: argparse.Namespace) -> int:
    """Grant a consumer group its topics (:func:`coordinator.ops.consumer_groups.add_consumer_group`) and print the
    grants its principal needs; with ``--account consumer:GROUP=ACCOUNT`` on S3, the bucket policy giving them.

    Example::

        $ txcoord add-consumer-group credits --topics ORDER_TOPIC --config conf/coordinator.toml \\
              --account consumer:credits=svc-credits
    """
    from coordinator.ops.consumer_groups import add_consumer_group
    from coordinator.ops.tenancy import consumer_principal

    config = CoordinatorConfig.load(args.config)
    try:
        grant = add_consumer_group(config, args.group, args.topics, args.shares)
    except InvalidArgumentError as error:
        print(f"txcoord add-consumer-group: {error}", file=sys.stderr)
        return EXIT_USAGE
    if not args.json:
        print(f"consumer group {grant.group} may read {', '.join(grant.topics)} ({grant.shares} shares a topic); "
              f"granted by {grant.granted_by}")
    return print_grants_of(args, config, {consumer_principal(grant.group)}, [],
                           {"group": grant.group, "topics": list(grant.topics), "shares": grant.shares,
                            "granted_by": grant.granted_by})


def run_describe(args: argparse.Namespace) -> int:
    """Print where a consumer group is (:func:`coordinator.ops.consumer_groups.describe_consumer_group`).

    Example::

        $ txcoord consumer-groups describe credits --config conf/coordinator.toml
    """
    from coordinator.ops.consumer_groups import describe_consumer_group

    described = describe_consumer_group(CoordinatorConfig.load(args.config), args.group, datetime.now(timezone.utc))
    if args.json:
        output.print_json(described.to_dict())
        return EXIT_OK
    if described.grant is None:
        print(f"consumer group {args.group} has no grant (`txcoord add-consumer-group`)")
    print(f"consumer group {described.group}: {len(described.live_instances)} live instance(s) "
          f"{' '.join(described.live_instances)}; {described.open_dead_letters} open dead letter(s)")
    for topic in described.topics:
        print(f"  {topic.topic}: position version {topic.position} of {topic.latest_version}, lag "
              f"{topic.lag_messages} message(s), {format_duration(topic.lag_seconds)}; {topic.retrying} retrying")
    return EXIT_OK


def run_reset(args: argparse.Namespace) -> int:
    """Move a stopped consumer group's position (:func:`coordinator.ops.consumer_groups.reset_consumer_group`).

    Example::

        $ txcoord consumer-groups reset credits --topic ORDER_TOPIC --to latest --config conf/coordinator.toml
    """
    from coordinator.ops.consumer_groups import reset_consumer_group

    try:
        version = reset_consumer_group(CoordinatorConfig.load(args.config), args.group, args.topic, args.to)
    except (ConsumerStateError, InvalidArgumentError) as error:
        print(f"txcoord consumer-groups reset: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json({"group": args.group, "topic": args.topic, "to": args.to, "version": version})
    else:
        print(f"consumer group {args.group} starts {args.topic} again at version {version}")
    return EXIT_OK


def run_dead_letters_list(args: argparse.Namespace) -> int:
    """Print a consumer group's open dead letters.

    Example::

        $ txcoord dead-letters list credits --config conf/coordinator.toml
    """
    from coordinator.ops.consumer_groups import open_dead_letters

    dead = open_dead_letters(CoordinatorConfig.load(args.config), args.group)
    if args.json:
        output.print_json({"group": args.group, "dead_letters": [_shown(d) for d in dead]})
        return EXIT_OK
    if not dead:
        print(f"consumer group {args.group} has no open dead letter")
    for d in dead:
        print(f"{d['msg_id']}  {d['topic']}  keys={d['keys']}  attempts={d['attempts']}  dead {d['dead_at']:%Y-%m-%d %H:%M:%S}"
              f"  {d['last_error']}")
    return EXIT_OK


def run_dead_letters_act(args: argparse.Namespace) -> int:
    """Redrive or discard a consumer group's dead letters, recording who did it.

    Example::

        $ txcoord dead-letters redrive credits --msg-id 9f2c... --config conf/coordinator.toml
    """
    from coordinator.ops.consumer_groups import discard_dead_letters, redrive_dead_letters

    act = redrive_dead_letters if args.verb == "redrive" else discard_dead_letters
    try:
        done = act(CoordinatorConfig.load(args.config), args.group, None if args.all else args.msg_ids,
                   reason=args.reason)
    except InvalidArgumentError as error:
        print(f"txcoord dead-letters {args.verb}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        output.print_json({"group": args.group, args.verb: [_shown(d) for d in done]})
    else:
        print(f"{len(done)} dead letter(s) of {args.group} {'redriven' if args.verb == 'redrive' else 'discarded'}")
    return EXIT_OK


def _shown(dead: dict) -> dict:
    """A dead letter as JSON-ready values (the body as text where it is UTF-8)."""
    shown = {key: (value.isoformat() if isinstance(value, datetime) else value) for key, value in dead.items()}
    try:
        shown["body"] = dead["body"].decode() if dead["body"] is not None else None
    except UnicodeDecodeError:
        shown["body"] = dead["body"].hex()
    return shown
