"""Whether output goes to a terminal: progress bars there, plain lines in a log file (Kaggle, Colab and
CI keep the output in one, where each redraw of a bar is a line of "\\r" noise); and how a duration
reads in those lines."""

from __future__ import annotations

import os
import sys

# the libraries' documented switches for their progress bars, read when each is imported; transformers
# takes huggingface_hub's
LIBRARY_BAR_SWITCHES = ("HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def is_interactive() -> bool:
    """A terminal tqdm can draw on. A pseudo-terminal of size 0 (`docker run -t` or `script` without
    a terminal behind them) is none: tqdm draws nothing there, so the run gets plain step lines."""
    if not sys.stderr.isatty() or os.environ.get("TERM") == "dumb":
        return False
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return size.columns > 0 and size.lines > 0


def clock_text(seconds: int) -> str:
    """A whole number of seconds as a clock reads: m:ss, or h:mm:ss from an hour (negative: 0:00)."""
    minutes, s = divmod(max(0, seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def no_library_bars_off_a_terminal() -> None:
    """Off a terminal, the bars of huggingface_hub, transformers and datasets are switched off, as this
    tool's own are. For a command's own process (they are read at import, before any is imported here;
    the environment passes them on to its workers); a switch the user set is kept."""
    if is_interactive():
        return
    for name in LIBRARY_BAR_SWITCHES:
        os.environ.setdefault(name, "1")
