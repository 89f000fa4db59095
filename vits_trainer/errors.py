"""User-facing errors: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable

from .launch import process_rank
from .terminal import no_library_bars_off_a_terminal


class UserError(Exception):
    """Bad input from the user (flags, paths, data). The message is shown as is."""


def cannot_read(name: str, err: OSError) -> UserError:
    """The one error line for a file of the user's that is there but cannot be read; `name` names it as the
    user gave it (`--text_file lines.txt`, a path)."""
    if isinstance(err, IsADirectoryError):
        return UserError(f"{name}: is a folder where a file is expected; pass a file")
    reason = err.strerror or str(err) or type(err).__name__
    if isinstance(err, PermissionError):
        return UserError(
            f"{name}: cannot be read ({reason}); make it readable to this user (chmod a+r) or copy "
            "it somewhere you own, then run again"
        )
    return UserError(
        f"{name}: cannot be read ({reason}); check the file and the disk it is on, then run again"
    )


def run_cli(
    main: Callable[[list[str] | None], int | None], argv: list[str] | None = None, one_process: bool = False
) -> int:
    """Run a CLI entry point; a UserError becomes `error: <message>` on stderr and exit code 2.
    `one_process`: a tool never started by a multi-process launch (prepare_data.py, speak.py, the
    discriminator converter) is the main process whatever RANK a launch left in the environment says,
    so its errors are always said."""
    runtime = sys.modules.get("vits_trainer.training.runtime")
    if runtime is not None:  # a command run in the same process before (tests): its log is closed
        runtime.Logger.copy.reset()
    try:
        code = main(argv)
    except UserError as err:
        rank = 0 if one_process else process_rank()  # a process of `accelerate launch` (0: the main one)
        if rank == 0:
            print(f"error: {err}", file=sys.stderr)
            _keep_in_log(f"error: {err}")
        elif _process_group_started():  # found by this process, maybe by it alone (its GPU's memory)
            print(f"error (process {rank}): {err}", file=sys.stderr)
        # else: the set-up's input checks, which every process makes alike: the main one says it once
        return 2
    except KeyboardInterrupt:
        if one_process or process_rank() == 0:  # Ctrl-C reaches every process: said once
            print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output left (`... | head`): what was written is kept; no traceback, and no
        # second error when Python flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # as a shell reports a command ended by SIGPIPE
    except Exception:
        _keep_in_log(traceback.format_exc().rstrip())  # a crash: its traceback in the run's log too
        raise
    finally:
        _close_process_group()
    return int(code or 0)


def run_command(main: Callable[[list[str] | None], int | None], one_process: bool = False) -> int:
    """A script's entry point: run_cli, with SIGTERM (a job manager, `kill PID`, a notebook's stop)
    stopping as Ctrl-C does until the training loop takes the signal over (it saves and prints the
    resume command): set-up and the run's end release the run's lock and say "interrupted", where
    Python's default ended the process with no word, its lock left behind. Off a terminal, the
    libraries' progress bars are switched off for the process, as its own are."""
    signal.signal(signal.SIGTERM, stop_as_ctrl_c)
    no_library_bars_off_a_terminal()
    return run_cli(main, one_process=one_process)


def stop_as_ctrl_c(signum, frame) -> None:
    raise KeyboardInterrupt


def _process_group_started() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _close_process_group() -> None:
    """A multi-process run's process group, destroyed before the interpreter exits: left to its
    finalization, gloo's worker threads can abort the process ("terminate called without an active
    exception", exit -6) after the run has ended well (pytorch/pytorch#190489)."""
    if _process_group_started():
        with contextlib.suppress(Exception):  # the run's outcome is decided already
            sys.modules["torch.distributed"].destroy_process_group()


def _keep_in_log(text: str) -> None:
    """Into the run's log file, once a run has one (training/runtime.py's LogCopy)."""
    runtime = sys.modules.get("vits_trainer.training.runtime")
    if runtime is not None and runtime.Logger.copy.path is not None:
        runtime.Logger.copy.add(text)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only when it says something (not `None` or an empty string: the help text
    then says what happens), and never breaks a flag value such as `duration_predictor` or a model id
    across lines."""

    def _get_help_string(self, action):
        if action.default in (None, "") or action.help is None:
            return action.help
        return super()._get_help_string(action)

    def _split_lines(self, text, width):
        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with every meaningful default in --help, and its errors as one `error:` line (no
    usage dump). A flag must be spelt out: a prefix (`--target_hour`) is not taken for the flag it
    begins, and a flag it does not know is named first, with the one that was probably meant."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._check_flag_names(args)  # before argparse, which reports a missing required flag first
        return super().parse_known_args(args, namespace)

    def _check_flag_names(self, args: list[str]) -> None:
        known = [s for s in self._option_string_actions if s.startswith("--")]
        for token in args:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if not name.startswith("--") or name in self._option_string_actions:
                continue
            underscored = "--" + name[2:].replace("-", "_")
            # a flag cut short (--base) means one it begins (--base_model), not the nearest spelling (--seed)
            begun = sorted(flag for flag in known if flag.startswith(underscored))
            if underscored in known:
                close = [underscored]
            else:
                close = begun[:3] or difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            self.error(f"unrecognized flag {name}{hint}")

    def error(self, message: str):
        raise UserError(f"{message} (see --help)")
