"""What the server of a federated run needs first: its run config, checked, and the
sites' replies to one request, gathered.

Run config (``[tool.flwr.app.config]`` of the app, overridden by ``flwr run
--run-config``); paths are on the SuperLink's machine and must be absolute:

    models        "NAME=/path/features.npz,..." (npz with ``features``), required
    sites         "site-a,site-b,...": the site ids expected to reply, required
    out           the CSV to write, required
    report        the consistency report page to write ("" for none)
    metrics       comma-separated registered metrics (kd,fd,precision,recall,density,
                  coverage by default; kd_sketch for sketch mode)
    kernel, kernel-params ("bandwidth=2.5,degree=3"; rbf/laplace need a bandwidth),
    kd-estimator, n-subsets, subset-size, seed, pr-k, dc-k, dtype: as in ``distrank score``
    weights       size or uniform
    timeout       seconds to wait for all sites to connect and reply

Every scoring option is read under its ``Option.key`` (``metrics._options.specs``), a
registered plugin metric's own included; the app's TOML declares the package's.

Secure mode's keys are :data:`distrank.flower.secure.SECURE_CONFIG`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from pathlib import Path

from flwr.app import Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from distrank.flower.messages import SiteReply, decode_reply, option_keys
from distrank.metrics._options import ScoreOptions, package_specs, specs


def _option_defaults(options) -> dict[str, object]:
    """The run config keys and defaults of ``options`` (name -> ``Option``), spelled as
    TOML keys and values (lists and kernel parameters as text)."""
    out = {}
    for name, option in options.items():
        default = option.default
        if name == "metrics":
            default = ",".join(default)
        elif name == "kernel_params":
            default = ""
        out[option.key] = default
    return out


#: the run config keys and their defaults (the app's pyproject.toml declares the same)
RUN_CONFIG = {
    "models": "",
    "sites": "",
    "out": "",
    "report": "",
    **_option_defaults(package_specs()),
    "timeout": 600.0,
}


class FederationError(RuntimeError):
    """Sites missing, failing or unknown: no table is written."""


@dataclass(frozen=True)
class RunSettings:
    """The run config, checked."""

    models: dict[str, Path]
    sites: list[str]
    out: Path
    report: Path | None
    score_options: ScoreOptions
    timeout: float

    @property
    def weights(self) -> str:
        return self.score_options.weights

    @property
    def options(self) -> dict:
        """The scoring options a request carries (``messages.option_keys``)."""
        keys = option_keys()
        return {k: v for k, v in self.score_options.as_dict().items() if k in keys}

    @classmethod
    def from_run_config(cls, config: Mapping) -> RunSettings:
        options = specs()  # the package's and any registered plugin metric's
        defaults = RUN_CONFIG | _option_defaults(options)

        def get(key, kind):
            value = config.get(key, defaults[key])
            if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
                name = getattr(kind, "__name__", None) or " or ".join(k.__name__ for k in kind)
                raise ValueError(f"run config: {key!r} must be {name}, got {value!r}")
            return value

        models = {}
        for spec in _items(get("models", str)):
            name, sep, path = spec.partition("=")
            if not sep or not name.strip() or name.strip() in models:
                raise ValueError(
                    f"run config: 'models' needs distinct NAME=PATH items, got {spec!r}"
                )
            models[name.strip()] = _absolute(path.strip(), "models")
        if not models:
            raise ValueError("run config: 'models' is empty (expected NAME=PATH,...)")
        sites = _items(get("sites", str))
        if not sites or len(set(sites)) != len(sites):
            raise ValueError(f"run config: 'sites' needs distinct site ids, got {sites!r}")
        timeout = float(get("timeout", (int, float)))
        if not timeout > 0:
            raise ValueError(f"run config: 'timeout' must be positive, got {timeout!r}")
        values = {  # of the option's type: str, int, float (an int is one too) or bool
            name: get(option.key, (int, float) if option.type is float else option.type)
            for name, option in options.items()
            if name not in ("metrics", "kernel_params")
        }
        values["metrics"] = _items(get("metrics", str))
        values["kernel_params"] = _kernel_params(get("kernel-params", str))
        try:
            options = ScoreOptions(**values)
        except ValueError as err:
            raise ValueError(f"run config: {err}") from None
        report = get("report", str)
        return cls(
            models,
            sites,
            _absolute(get("out", str), "out"),
            _absolute(report, "report") if report else None,
            options,
            timeout,
        )


def gather(
    grid: Grid,
    request: RecordDict,
    *,
    sites: Sequence[str],
    timeout: float,
    poll: float = 1.0,
    decode: Callable[[Message], SiteReply] | None = None,
) -> list[SiteReply]:
    """Send ``request`` to every node and return the replies of ``sites``, in that order.

    Nodes that connect while the server waits get the request too; the wait ends
    when every site in ``sites`` has answered or after ``timeout`` seconds. Raises
    :class:`FederationError` naming each site that did not reply in time, replied
    with an error or twice, and each reply from a site not in ``sites``. ``decode``
    reads a reply message (default: :func:`decode_reply` of its content); what it
    returns needs a ``site`` and an ``error``.
    """
    deadline = time.monotonic() + timeout
    pending: dict[str, int] = {}  # message id -> node id
    contacted: set[int] = set()
    problems: list[str] = []
    heard: dict[str, SiteReply] = {}
    while True:
        new = [node for node in grid.get_node_ids() if node not in contacted]
        if new:
            messages = [
                Message(request, dst_node_id=node, message_type=MessageType.QUERY, ttl=timeout)
                for node in new
            ]
            ids = list(grid.push_messages(messages))
            if len(ids) != len(new) or not all(ids):
                raise FederationError(
                    f"the SuperLink did not accept the request for nodes "
                    f"{new} (see its log; too large a message?)"
                )
            pending.update(zip(ids, new))
            contacted.update(new)
            log(INFO, "distrank: request sent to %d node(s), %d in all", len(new), len(contacted))
        if pending:
            for reply in grid.pull_messages(list(pending)):
                node = pending.pop(reply.metadata.reply_to_message_id, None)
                _read_reply(reply, node, sites, heard, problems, decode)
        if all(site in heard for site in sites) or time.monotonic() >= deadline:
            break
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))
    missing = [site for site in sites if site not in heard]
    if missing:
        problems.insert(
            0,
            f"no reply within {timeout:g} s from site(s) {missing} "
            f"({len(contacted)} node(s) contacted)",
        )
    if problems:
        raise FederationError("; ".join(problems))
    return [heard[site] for site in sites]


def _read_reply(
    reply: Message,
    node,
    sites: Sequence[str],
    heard: dict[str, SiteReply],
    problems: list[str],
    decode: Callable[[Message], SiteReply] | None = None,
) -> None:
    """File one reply under ``heard`` (by site id) or a problem under ``problems``."""
    if reply.has_error():
        problems.append(f"node {node} failed: {reply.error.reason}")
        return
    try:
        decoded = decode(reply) if decode else decode_reply(reply.content)
    except (ValueError, KeyError) as err:
        problems.append(f"node {node} sent a malformed reply: {err}")
        return
    name = str(decoded.site)
    if name not in sites:
        problems.append(f"site {name!r} (node {node}) is not one of the sites {list(sites)}")
    elif name in heard:
        problems.append(f"site {name!r} replied twice (two nodes with one site-id)")
    else:
        heard[name] = decoded
        if decoded.error:
            problems.append(f"site {name!r} failed: {decoded.error}")


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _absolute(path: str, key: str) -> Path:
    if not path or not Path(path).is_absolute():
        raise ValueError(f"run config: {key!r} needs an absolute path on the server, got {path!r}")
    return Path(path)


def _kernel_params(text: str) -> dict[str, float | int]:
    params = {}
    for item in _items(text):
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise ValueError(f"run config: 'kernel-params' needs NAME=NUMBER items, got {item!r}")
        integral = name.strip() == "degree" and number.is_integer()
        params[name.strip()] = int(number) if integral else number
    return params
