"""Objectives: what one candidate's evaluation returns, from a Python callable or a command.

An evaluation ends in an :class:`Outcome` with a status, as a benchmark row does: ``ok`` (with a
throughput, higher is better, and optionally the peak memory per rank), ``oom`` (out of memory:
the strategies treat it as "does not fit"), ``fail`` (anything else went wrong) or ``timeout``.
A failed candidate is still an outcome, stored in the study, never dropped.

* :class:`CallableObjective` wraps ``fn(values) -> float | dict | Outcome``; a ``MemoryError``
  or ``torch.OutOfMemoryError`` it raises is ``oom``, any other exception ``fail``.
* :class:`CommandObjective` runs a command per candidate (the benchmark driver, say) with a
  timeout (then SIGTERM to its process group, SIGKILL 10 s later). ``{name}`` in its arguments
  is replaced by the candidate's value of ``name`` (a symbol or a derived value),
  ``{result_file}`` by a fresh file path; every value is also exported as
  ``SLAPO_TUNE_<NAME>``. The result is the JSON object the command writes to ``{result_file}``,
  or else the last line of its standard output that is a JSON object, e.g.
  ``{"status": "ok", "throughput": 12.5, "memory_gb": 0.8}`` (``status`` defaults to ``ok``
  when a throughput is given; other keys are kept as extra data, e.g. ``config_line``).
  The original tuner scraped a log file for a throughput and let a zero mean any error; here the
  command states what happened. A command that exits with :data:`REFUSED` (75, EX_TEMPFAIL)
  refuses to evaluate the candidate now (e.g. the machine is busy): the tuner stops with a
  :class:`TuneError` quoting the command's last line on stderr, and the candidate stays
  unevaluated, so the same session resumes with it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from ..errors import TuneError

__all__ = ["Outcome", "Objective", "CallableObjective", "CommandObjective", "as_objective",
           "STATUSES", "REFUSED"]

STATUSES = ("ok", "oom", "fail", "timeout")
REFUSED = 75  # a command's "not now" (EX_TEMPFAIL): the tuner stops, nothing is stored
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class Outcome:
    """The result of evaluating one candidate (see the module docstring)."""

    status: str
    throughput: Optional[float] = None
    memory_gb: Optional[float] = None
    error: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise TuneError(f"outcome status {self.status!r} is not one of {STATUSES}",
                            call="Outcome")
        if self.status == "ok":
            t = self.throughput
            if t is None or isinstance(t, bool) or not isinstance(t, (int, float)) \
                    or not math.isfinite(t):
                raise TuneError(f"an ok outcome needs a finite throughput, got {t!r}",
                                call="Outcome", hint="return status 'fail' with an error")
            self.throughput = float(t)

    @classmethod
    def from_result(cls, result: Any) -> "Outcome":
        """An Outcome from what an objective returned: a number (the throughput), a dict with
        ``status``/``throughput``/``memory_gb``/``error`` (other keys go to ``extra``), or an
        Outcome."""
        if isinstance(result, Outcome):
            return result
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return cls("ok", float(result))
        if isinstance(result, Mapping):
            data = dict(result)
            status = data.pop("status", "ok" if data.get("throughput") is not None else "fail")
            throughput = data.pop("throughput", None)
            memory = data.pop("memory_gb", None)
            error = str(data.pop("error", "") or "")
            if status != "ok" and not error:
                error = f"the objective reported status {status!r}"
            return cls(str(status), throughput, None if memory is None else float(memory),
                       error, data)
        raise TuneError(f"the objective returned {result!r} ({type(result).__name__})",
                        call="objective", hint="return a throughput (float), a dict with "
                        "'status' and 'throughput', or an Outcome")


class Objective:
    """Evaluates one candidate: ``objective(values) -> Outcome`` (values include derived ones)."""

    def __call__(self, values: Mapping[str, Any]) -> Outcome:
        raise NotImplementedError

    def describe(self, values: Mapping[str, Any]) -> str:
        """How to reproduce one evaluation (a command line, or the callable's name)."""
        return ""


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return "out of memory" in str(exc).lower()


class CallableObjective(Objective):
    """A Python function as the objective (see the module docstring)."""

    def __init__(self, fn: Callable[[Dict[str, Any]], Any]):
        if not callable(fn):
            raise TuneError(f"objective {fn!r} is not callable", call="CallableObjective")
        self.fn = fn

    def __call__(self, values: Mapping[str, Any]) -> Outcome:
        try:
            result = self.fn(dict(values))
        except Exception as exc:  # noqa: BLE001  (a failed candidate is an outcome)
            status = "oom" if _is_oom(exc) else "fail"
            return Outcome(status, error=f"{type(exc).__name__}: {exc}")
        return Outcome.from_result(result)

    def describe(self, values: Mapping[str, Any]) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"{name}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


class CommandObjective(Objective):
    """A command run per candidate (see the module docstring). ``timeout`` in seconds (None: no
    limit); on timeout the command's process group gets SIGTERM, then SIGKILL."""

    def __init__(self, command: Sequence[str], timeout: Optional[float] = None,
                 env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None):
        if isinstance(command, str):
            command = shlex.split(command)
        self.command = [str(a) for a in command]
        if not self.command:
            raise TuneError("the objective command is empty", call="CommandObjective",
                            hint="give it after '--', e.g. -- python bench.py --batch "
                            "{batch_size}")
        if timeout is not None and not (timeout > 0):
            raise TuneError(f"timeout {timeout!r} is not positive", call="CommandObjective")
        self.timeout = timeout
        self.env = dict(env or {})
        self.cwd = cwd

    def placeholders(self) -> List[str]:
        """The ``{name}`` placeholders of the command, in order of appearance."""
        found: List[str] = []
        for arg in self.command:
            found += [m for m in _PLACEHOLDER.findall(arg) if m not in found]
        return found

    def check(self, names: Sequence[str]) -> None:
        """Raise :class:`TuneError` for a placeholder that names no symbol or derived value."""
        unknown = [p for p in self.placeholders() if p not in names and p != "result_file"]
        if unknown:
            raise TuneError(f"placeholder(s) {', '.join('{%s}' % u for u in unknown)} in the "
                            f"command name no symbol or derived value", call="CommandObjective",
                            hint=f"known: {', '.join(names)} (and {{result_file}})")

    def render(self, values: Mapping[str, Any], result_file: str = "") -> List[str]:
        """The command line of one candidate."""
        subst = {k: _text(v) for k, v in values.items()}
        subst["result_file"] = result_file

        def one(arg: str) -> str:
            return _PLACEHOLDER.sub(lambda m: subst.get(m.group(1), m.group(0)), arg)
        return [one(a) for a in self.command]

    def describe(self, values: Mapping[str, Any]) -> str:
        return shlex.join(self.render(values, "RESULT.json"))

    def __call__(self, values: Mapping[str, Any]) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="slapo-tune-") as tmp:
            result_file = os.path.join(tmp, "result.json")
            env = {**self.env, **{f"SLAPO_TUNE_{k.upper()}": _text(v) for k, v in values.items()}}
            run = run_command(self.render(values, result_file), self.timeout, env, self.cwd)
            if run.started is not None:
                return Outcome("fail", error=run.started)
            if run.timed_out:
                return Outcome("timeout", error=f"no result after {self.timeout:g} s "
                               f"(the command's process group was stopped)")
            if run.returncode == REFUSED:
                why = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["(no message)"]
                raise TuneError(f"the objective command refused to evaluate {dict(values)}: "
                                f"{why[0]}", call="CommandObjective",
                                hint="remove the cause and run the same command again: it "
                                     "resumes with this candidate")
            extra = {"seconds": run.seconds, "returncode": run.returncode}
            return _read_result(result_file, run.stdout, run.stderr, run.returncode, extra)


@dataclass
class CommandRun:
    """What :func:`run_command` saw: ``started`` is None, or why the command could not start."""

    stdout: str = ""
    stderr: str = ""
    returncode: Optional[int] = None
    timed_out: bool = False
    seconds: float = 0.0
    started: Optional[str] = None


def run_command(argv: Sequence[str], timeout: Optional[float], env: Mapping[str, str],
                cwd: Optional[str] = None) -> CommandRun:
    """Run ``argv`` in a session of its own (``env`` added to this process's environment),
    capturing its output; on ``timeout`` seconds, or an interrupt, its whole process group is
    stopped (SIGTERM, then SIGKILL). Shared by objectives and predictors."""
    start = time.time()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **env}, cwd=cwd,
                                start_new_session=True)
    except OSError as exc:
        return CommandRun(started=f"cannot start {argv[0]!r}: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return CommandRun(timed_out=True, seconds=round(time.time() - start, 3))
    except BaseException:  # interrupted: leave no process behind
        _kill_group(proc)
        raise
    return CommandRun(out, err, proc.returncode, False, round(time.time() - start, 3))


def json_line(out: str) -> Optional[Dict[str, Any]]:
    """The last line of ``out`` that is a JSON object, or None."""
    for line in reversed(out.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                return data
    return None


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _kill_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the command's process group (a launcher can stop what it started in other
    sessions, e.g. torchrun's ranks), then SIGKILL to what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.communicate(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.communicate()


def _read_result(result_file: str, out: str, err: str, returncode: int,
                 extra: Dict[str, Any]) -> Outcome:
    data: Optional[Dict[str, Any]] = None
    if os.path.exists(result_file):
        with open(result_file) as fh:
            text = fh.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            return Outcome("fail", error=f"result file is not JSON ({exc}): {text[:200]!r}",
                           extra=extra)
    else:
        data = json_line(out)
    if not isinstance(data, dict):
        tail = " | ".join((err or out).strip().splitlines()[-3:])
        return Outcome("fail", error=f"exit status {returncode}, no JSON result line: {tail}",
                       extra=extra)
    try:
        outcome = Outcome.from_result(data)
    except TuneError as exc:
        return Outcome("fail", error=str(exc), extra=extra)
    outcome.extra.update(extra)
    return outcome


def as_objective(obj: Union[Objective, Callable, Sequence[str], str],
                 timeout: Optional[float] = None) -> Objective:
    """An :class:`Objective` from an objective, a callable, or a command (list or string)."""
    if isinstance(obj, Objective):
        return obj
    if callable(obj):
        return CallableObjective(obj)
    return CommandObjective(obj, timeout=timeout)
