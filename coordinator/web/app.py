"""The console's web application (Flask): pages, login, and the operators' actions: ending a transaction by
hand, and redriving or discarding a consumer group's dead letters.

Every page needs a signed-in user (a session cookie from ``/login``); every form carries a CSRF
token (Flask-WTF), the session cookie is ``SameSite=Strict`` and no page may be framed. Pages read
the lakehouse as the signed-in user (their own storage credentials if the users file gives them
some, else the console's): a refusal by the storage is shown as such, naming the path. Ending a
transaction goes through :func:`coordinator.ops.resolve.resolve_transaction`, as ``txcoord
resolve`` does: an END in the operators' commit log carrying who and why; the checker stays the
only writer of its tables. A consumer group's page shows what ``txcoord consumer-groups describe`` shows
(:func:`coordinator.ops.consumer_groups.describe_consumer_group`) and its open dead letters; redriving or
discarding them goes through the functions ``txcoord dead-letters`` calls, recorded in the group's
``operator_actions`` with the console user's name. Each page is a view function of this module,
registered by :func:`create_app` under its own name.

Example::

    app = create_app(CoordinatorConfig.load("conf/coordinator.toml"), ConsoleUsers.load("conf/console-users.toml"))
    app.run()  # development only: ``txcoord console`` serves it with waitress
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import secrets
import socket
from dataclasses import dataclass, field
from typing import Callable, Optional

from flask import Flask, Response, abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import LoginManager, UserMixin, current_user, login_required, login_user, logout_user
from flask_wtf import FlaskForm
from flask_wtf.csrf import CSRFError, CSRFProtect
from wtforms import BooleanField, PasswordField, StringField, TextAreaField
from wtforms.validators import DataRequired, Length

from coordinator.commit_logs import CommitLogs
from coordinator.config import CoordinatorConfig
from coordinator.durations import format_duration, parse_duration
from coordinator.exceptions import (AccessDeniedError, CorruptInputError, InvalidArgumentError, LakehouseNotFoundError,
                                    MessageValidationError)
from coordinator.lakehouse import Lakehouse, require_lakehouse
from coordinator.names import validate_name
from coordinator.ops.audit import outcome, transaction_timeline
from coordinator.ops.consumer_groups import (consumer_group_grants, describe_consumer_group, discard_dead_letters,
                                             open_dead_letters, operator_actions, redrive_dead_letters)
from coordinator.ops.discarded import discarded_transactions
from coordinator.ops.pending import pending_transactions
from coordinator.ops.resolve import preview_resolution, resolve_transaction
from coordinator.ops.status import read_status
from coordinator.protocol import MAX_REASON_LENGTH, LocalTransactionState
from coordinator.web import charts
from coordinator.web.recent import RecentBatches
from coordinator.web.users import ConsoleUser, ConsoleUsers

__all__ = ["create_app"]

log = logging.getLogger("coordinator.web")

UTC = dt.timezone.utc
#: The decisions a form may ask for, by the name in its URL.
_DECISIONS = {"commit": LocalTransactionState.COMMIT_MESSAGE, "rollback": LocalTransactionState.ROLLBACK_MESSAGE}
#: What an operator may do with dead letters, by the name in its URL, and how the outcome is said.
_DEAD_LETTER_ACTIONS = {"redrive": (redrive_dead_letters, "redriven: delivered to the group's listener again"),
                        "discard": (discard_dead_letters, "discarded for good")}
#: The age filters offered on the pending page (any other ``older_than`` in the URL works too).
AGE_FILTERS = ("", "1m", "10m", "1h", "1d")
_CHART_WINDOWS_MIN = (5, 15, 60)


class _SignedIn(UserMixin):
    """A console user as Flask-Login holds them for a request."""

    def __init__(self, user: ConsoleUser):
        self.user = user

    def get_id(self) -> str:
        return self.user.name


class LoginForm(FlaskForm):
    username = StringField("User", validators=[DataRequired()])
    password = PasswordField("Password", validators=[DataRequired()])


class ResolveForm(FlaskForm):
    reason = TextAreaField("Reason (kept in the audit trail)", validators=[DataRequired(), Length(max=MAX_REASON_LENGTH)])
    confirm = BooleanField("I have checked the preview", validators=[DataRequired()])


class LogoutForm(FlaskForm):
    pass


class DeadLettersForm(FlaskForm):
    """Redrive or discard the dead letters whose ``msg_id`` boxes are ticked (the ``msg_id`` fields of the form)."""

    reason = TextAreaField("Reason (kept with the action)", validators=[Length(max=MAX_REASON_LENGTH)])


@dataclass
class _Console:
    """What one app's views share: whose lakehouse, who may sign in, the clock, and the batches read so far."""

    config: CoordinatorConfig
    users: ConsoleUsers
    refresh_s: int
    clock: Callable[[], dt.datetime]
    host: str = field(default_factory=socket.gethostname)
    recent: dict[tuple, RecentBatches] = field(default_factory=dict)


#: Where an app keeps its :class:`_Console` (``app.extensions``).
_CONSOLE = "txcoord_console"
#: The views, as :func:`_route` collects them for :func:`create_app`: (rule, view, methods).
_ROUTES: list[tuple[str, Callable, tuple[str, ...]]] = []


def create_app(config: CoordinatorConfig, users: ConsoleUsers, refresh_s: int = 5,
               clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(UTC)) -> Flask:
    """The console for ``config``'s lakehouse, signing in ``users``; pages that follow live state
    reload every ``refresh_s`` seconds; ``clock`` says what time it is (ages, chart windows).

    Example::

        client = create_app(config, users).test_client()
    """
    app = Flask(__name__, static_folder=None)
    app.config.update(
        # Per process: a restarted console signs everyone out, and no key is ever stored.
        SECRET_KEY=secrets.token_bytes(32),
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_HTTPONLY=True,
        PERMANENT_SESSION_LIFETIME=dt.timedelta(hours=8),
        WTF_CSRF_TIME_LIMIT=None,  # a token lives as long as its session
    )
    app.extensions[_CONSOLE] = _Console(config, users, refresh_s, clock)
    CSRFProtect(app)
    logins = LoginManager(app)
    logins.login_view = "login"
    logins.login_message = "Sign in to use the console."
    logins.login_message_category = "info"
    logins.user_loader(_load_user)
    app.context_processor(_common)
    app.jinja_env.filters["duration"] = format_duration
    app.jinja_env.filters["excerpt"] = _excerpt
    app.jinja_env.filters["utc"] = lambda t: t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "–"
    app.after_request(_protect)
    for error, handler in _ERROR_PAGES.items():
        app.register_error_handler(error, handler)
    for rule, view, methods in _ROUTES:
        app.add_url_rule(rule, view_func=view, methods=methods)
    return app


def _console() -> _Console:
    return current_app.extensions[_CONSOLE]


def _load_user(name: str) -> Optional[_SignedIn]:
    user = _console().users.get(name)
    return _SignedIn(user) if user else None


def _user() -> ConsoleUser:
    return current_user.user


def _user_config() -> CoordinatorConfig:
    """The configuration with the signed-in user's own storage credentials, if they have any."""
    config, own = _console().config, _user().storage
    return config.replace(storage={**config.storage, **own}) if own else config


def _recent_batches(config: CoordinatorConfig) -> RecentBatches:
    """One in-memory window of batches per storage account the users read with."""
    recent = _console().recent
    key = tuple(sorted(config.storage.items()))
    if key not in recent:
        recent[key] = RecentBatches(require_lakehouse(Lakehouse.of(config)))
    return recent[key]


def _operator_only(action: str):
    """Refuse the view below (403) to a viewer, saying that ``action`` takes the operator role."""
    def guarded(view):
        @functools.wraps(view)
        def checked(*args, **kwargs):
            if not _user().is_operator:
                abort(403, description=f"{_user().name} is a viewer: {action} takes the operator role")
            return view(*args, **kwargs)
        return checked
    return guarded


def _operator_name() -> str:
    """Who an operator's action is recorded as: the signed-in user, and this console's host."""
    return f"{_user().name} (txcoord console on {_console().host})"


def _common() -> dict:
    console = _console()
    return {"user": _user() if current_user.is_authenticated else None, "logout_form": LogoutForm(),
            "lakehouse": console.config.lakehouse, "refresh_s": console.refresh_s}


def _protect(response: Response) -> Response:
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = ("default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                                                   "form-action 'self'; frame-ancestors 'none'")
    response.headers["Cache-Control"] = "no-store"
    return response


def _denied(error: AccessDeniedError):
    return render_template("error.html", title="Refused by the storage", message=str(error)), 403


def _no_lakehouse(error: LakehouseNotFoundError):
    return render_template("error.html", title="No lakehouse", message=str(error)), 503


def _forged(error: CSRFError):
    log.warning("refused a %s to %s without a valid CSRF token (%s)", request.method, request.path, error.description)
    return render_template("error.html", title="Refused", message="This form did not come from this console's page "
                           f"(or your session ended): {error.description} Reload the page and try again."), 400


def _forbidden(error):
    return render_template("error.html", title="Not allowed", message=error.description), 403


def _bad_request(error):
    return render_template("error.html", title="Bad request", message=error.description), 400


_ERROR_PAGES = {AccessDeniedError: _denied, LakehouseNotFoundError: _no_lakehouse, CSRFError: _forged, 403: _forbidden,
                400: _bad_request}


def _route(rule: str, methods: tuple[str, ...] = ("GET",)):
    """Collect the view below for :func:`create_app`, under its own name as the endpoint (``url_for("overview")``)."""
    def collected(view: Callable) -> Callable:
        _ROUTES.append((rule, view, methods))
        return view
    return collected


@_route("/login", methods=("GET", "POST"))
def login():
    form = LoginForm()
    if form.validate_on_submit():
        found = _console().users.authenticate(form.username.data, form.password.data)
        if found is None:
            log.warning("console sign-in refused for %r from %s", form.username.data, request.remote_addr)
            flash("Unknown user or wrong password.", "error")
            return render_template("login.html", form=form), 401
        login_user(_SignedIn(found))
        log.info("console: %s (%s) signed in from %s", found.name, found.role, request.remote_addr)
        target = request.args.get("next", "")
        return redirect(target if target.startswith("/") and not target.startswith("//") else url_for("overview"))
    return render_template("login.html", form=form)


@_route("/logout", methods=("POST",))
@login_required
def logout():
    if LogoutForm().validate_on_submit():
        log.info("console: %s signed out", _user().name)
        logout_user()
    return redirect(url_for("login"))


@_route("/")
@login_required
def overview():
    status = read_status(_user_config(), now=_console().clock())
    minutes = _window(request.args.get("minutes"))
    return render_template("overview.html", status=status, minutes=minutes, windows=_CHART_WINDOWS_MIN)


@_route("/charts/<name>.svg")
@login_required
def chart(name: str):
    now = _console().clock()
    minutes = _window(request.args.get("minutes"))
    since = now - dt.timedelta(minutes=minutes)
    rows = _recent_batches(_user_config()).since(since, now)
    if name == "throughput":
        svg = charts.throughput_chart(rows, since, now, bucket_s=max(1, minutes * 60 // 90))
    elif name == "latency":
        svg = charts.latency_chart(rows, since, now)
    elif name == "batches":
        svg = charts.batches_chart(rows, since, now)
    else:
        abort(404)
    return Response(svg, mimetype="image/svg+xml")


@_route("/pending")
@login_required
def pending():
    config = _user_config()
    group = request.args.get("group") or None
    older_than = request.args.get("older_than", "")
    try:
        older_than_s = parse_duration(older_than) if older_than else 0.0
    except InvalidArgumentError as error:
        flash(str(error), "error")
        older_than, older_than_s = "", 0.0
    now = _console().clock()
    transactions = pending_transactions(config, older_than_s=older_than_s, group=group, now=now)
    return render_template("pending.html", transactions=transactions, now=now, group=group or "",
                           groups=_groups(config, transactions), older_than=older_than, age_filters=AGE_FILTERS)


@_route("/discarded")
@login_required
def discarded():
    config = _user_config()
    group = request.args.get("group") or None
    transactions = discarded_transactions(config, group=group)
    return render_template("discarded.html", transactions=transactions, group=group or "",
                           groups=_groups(config, transactions))


@_route("/find")
@login_required
def find():
    transaction_id = (request.args.get("transaction_id") or "").strip()
    return redirect(url_for("transaction", transaction_id=transaction_id) if transaction_id else url_for("overview"))


@_route("/transactions/<transaction_id>")
@login_required
def transaction(transaction_id: str):
    events = transaction_timeline(Lakehouse.of(_user_config()), transaction_id)
    if not events:
        return render_template("error.html", title="Unknown transaction",
                               message=f"No table knows transaction {transaction_id}."), 404
    ended = outcome(events)
    return render_template("transaction.html", transaction_id=transaction_id, events=events, outcome=ended,
                           discarded=any(e.step == "discarded" for e in events))


@_route("/transactions/<transaction_id>/<decision>", methods=("GET", "POST"))
@login_required
@_operator_only("ending a transaction")
def resolve(transaction_id: str, decision: str):
    if decision not in _DECISIONS:
        abort(404)
    config = _user_config()
    form = ResolveForm()
    try:
        preview = preview_resolution(config, transaction_id, _DECISIONS[decision])
    except InvalidArgumentError as error:
        return render_template("error.html", title=f"Cannot {decision} {transaction_id}", message=str(error)), 409
    if form.validate_on_submit():
        try:
            record = resolve_transaction(config, transaction_id, _DECISIONS[decision], form.reason.data,
                                         operator=_operator_name())
        except InvalidArgumentError as error:
            flash(str(error), "error")
        else:
            log.info("console: %s sent %s of transaction %s (%s): %s", _user().name, record["state"], transaction_id,
                     record["check_id"], form.reason.data.strip())
            flash(f"{record['state']} sent as {record['check_id']}: the checker applies it at its next batch.", "ok")
            return redirect(url_for("transaction", transaction_id=transaction_id))
    return render_template("resolve.html", preview=preview, decision=decision, form=form), 422 if form.errors else 200


@_route("/consumers")
@login_required
def consumer_groups():
    config = _user_config()
    grants, refused = consumer_group_grants(Lakehouse.of(config))
    now, groups = _console().clock(), []
    for grant in grants:  # one group's corrupt record costs that group's row alone
        try:
            groups.append(describe_consumer_group(config, grant.group, now))
        except CorruptInputError as error:
            refused.append(f"consumer group {grant.group}: {error}")
    return render_template("consumer_groups.html", groups=groups, refused=refused)


@_route("/consumers/<group>")
@login_required
def consumer_group(group: str):
    config = _user_config()
    _require_group_name(group)
    try:
        described = describe_consumer_group(config, group, _console().clock())
    except CorruptInputError as error:
        return render_template("error.html", title=f"Consumer group {group} cannot be read", message=str(error)), 409
    if described.grant is None and not described.topics and not described.open_dead_letters:
        return render_template("error.html", title="Unknown consumer group",
                               message=f"No consumer group {group} (`txcoord add-consumer-group` adds one)."), 404
    return render_template("consumer_group.html", described=described, dead=open_dead_letters(config, group),
                           actions=operator_actions(config, group), form=DeadLettersForm())


@_route("/consumers/<group>/dead-letters/<action>", methods=("POST",))
@login_required
@_operator_only("redriving or discarding dead letters")
def dead_letters(group: str, action: str):
    if action not in _DEAD_LETTER_ACTIONS:
        abort(404)
    _require_group_name(group)
    act, done_text = _DEAD_LETTER_ACTIONS[action]
    form, msg_ids = DeadLettersForm(), request.form.getlist("msg_id")
    reason = (form.reason.data or "").strip()
    if not form.validate_on_submit():
        flash(" ".join(f"{field}: {', '.join(errors)}" for field, errors in form.errors.items()), "error")
    elif not msg_ids:
        flash(f"Tick the dead letters to {action} first: nothing was done.", "error")
    else:
        try:
            done = act(_user_config(), group, msg_ids, operator=_operator_name(), reason=reason)
        except InvalidArgumentError as error:
            flash(f"Nothing was done: {error}", "error")
        else:
            log.info("console: %s did %s of %d dead letter(s) of consumer group %s: %s", _user().name, action,
                     len(done), group, reason)
            flash(f"{len(done)} dead letter(s) of {group} {done_text}.", "ok")
    return redirect(url_for("consumer_group", group=group))


def _require_group_name(group: str) -> None:
    """A consumer group's name from a URL, held to the name rule (400 saying why otherwise)."""
    try:
        validate_name("consumer group", group)
    except MessageValidationError as error:
        abort(400, description=str(error))



def _excerpt(body: Optional[bytes], limit: int = 160) -> str:
    """The start of a message body as text, for a preview (undecodable bytes shown as such)."""
    text = (body or b"")[:limit].decode("utf-8", "replace")
    return text + (" …" if len(body or b"") > limit else "")


def _window(minutes: Optional[str]) -> int:
    """The chart window asked for, one of those offered (default the middle one)."""
    try:
        return int(minutes) if int(minutes) in _CHART_WINDOWS_MIN else _CHART_WINDOWS_MIN[1]
    except (TypeError, ValueError):
        return _CHART_WINDOWS_MIN[1]


def _groups(config: CoordinatorConfig, seen: list) -> list[str]:
    """The producer groups to filter by: every group's log the user may list, else those of the rows shown."""
    try:
        return sorted({ref.group for ref in CommitLogs(Lakehouse.of(config)).discover() if ref.group is not None})
    except AccessDeniedError:  # e.g. analysts: they read the checker's tables, not the groups' directory
        return sorted({row.producer_group for row in seen})
