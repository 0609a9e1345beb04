"""Progress: a bar redrawn in place on a terminal, plain periodic lines elsewhere."""

import io

from streamapp.cli.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_lines_are_written_once_per_interval_and_at_the_end():
    clock, out = Clock(), io.StringIO()
    with Progress("produce", total=600, unit="frames", stream=out, interval_s=10, clock=clock) as progress:
        for _ in range(600):
            clock.now += 0.0625  # 16 frames/s: 37.5 s in all
            progress.advance()
    lines = out.getvalue().splitlines()
    assert lines == [
        "produce: 160/600 frames (27%), 16.0 frames/s, 28 s left",
        "produce: 320/600 frames (53%), 16.0 frames/s, 18 s left",
        "produce: 480/600 frames (80%), 16.0 frames/s, 8 s left",
        "produce: 600/600 frames in 37.5 s (16.0 frames/s)",
    ]
    assert "\r" not in out.getvalue()


def test_a_terminal_gets_one_line_redrawn_in_place():
    clock, out = Clock(), Terminal()
    progress = Progress("replay", total=4, unit="records", stream=out, clock=clock)
    for _ in range(4):
        clock.now += 1
        progress.advance()
    progress.close()
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    redraws = text.rstrip("\n").split("\r")[1:]
    assert len(redraws) == 5  # every advance (1 s apart) and the close
    assert redraws[1].startswith("replay [" + "#" * 15 + "." * 15 + "]  50% 2/4 records 1.0 records/s, 2 s left")
    assert redraws[-1].startswith("replay [" + "#" * 30 + "] 100% 4/4 records")


def test_without_a_total_it_shows_the_count_and_rate():
    clock, out = Clock(), io.StringIO()
    progress = Progress("record", stream=out, interval_s=1, unit="records", clock=clock)
    clock.now += 2
    progress.advance(10)
    assert out.getvalue() == "record: 10 records, 5.0 records/s\n"


def test_a_fast_loop_on_a_terminal_is_not_redrawn_for_every_item():
    clock, out = Clock(), Terminal()
    progress = Progress("bench", total=10_000, stream=out, clock=clock)
    for _ in range(10_000):
        clock.now += 1 / 8192  # about 1.2 s in all
        progress.advance()
    assert out.getvalue().count("\r") == 12  # one per 0.1 s
