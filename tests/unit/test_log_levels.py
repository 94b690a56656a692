"""Which level a log line announces, and what the service keeps of a message."""

from __future__ import annotations

import pytest

from master.services.logs import MAX_MESSAGE_BYTES, clip_message, levels_at_or_above, parse_level


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("ERROR:root:boom\n", "LOG_LEVEL_ERROR"),
        ("WARNING:determined.core:slow\n", "LOG_LEVEL_WARNING"),
        ("INFO: [1234] determined.core: started\n", "LOG_LEVEL_INFO"),
        ("DEBUG something\n", "LOG_LEVEL_DEBUG"),
        ("TRACE x\n", "LOG_LEVEL_TRACE"),
        ("CRITICAL:root:down\n", "LOG_LEVEL_CRITICAL"),
        ("FATAL: out of memory\n", "LOG_LEVEL_CRITICAL"),
        ("WARN low disk\n", "LOG_LEVEL_WARNING"),
        ("[ERROR] failed\n", "LOG_LEVEL_ERROR"),
        ("[2026-11-21 01:02:03,123] WARNING retrying\n", "LOG_LEVEL_WARNING"),
        ("[2026-11-21T01:02:03Z] [ERROR] failed\n", "LOG_LEVEL_ERROR"),
        ("2026-11-21 01:02:03,123 ERROR loader: bad file\n", "LOG_LEVEL_ERROR"),
        ("2026-11-21T01:02:03.5+00:00 DEBUG tick\n", "LOG_LEVEL_DEBUG"),
        ("[rank=1] ERROR: rank failed\n", "LOG_LEVEL_ERROR"),
        ("  ERROR indented\n", "LOG_LEVEL_ERROR"),
        ("ERROR\n", "LOG_LEVEL_ERROR"),
        ("ERROR", "LOG_LEVEL_ERROR"),
        # Plain output, and words that only start like a level, stay INFO.
        ("epoch 1 loss 0.3\n", "LOG_LEVEL_INFO"),
        ("Error: lowercase is prose\n", "LOG_LEVEL_INFO"),
        ("ERRORS: 3\n", "LOG_LEVEL_INFO"),
        ("INFORMATION follows\n", "LOG_LEVEL_INFO"),
        ("WARNINGS: none\n", "LOG_LEVEL_INFO"),
        ("the ERROR is later\n", "LOG_LEVEL_INFO"),
        ("[2026-11-21] done\n", "LOG_LEVEL_INFO"),
        ("rank 1 exited with code 1\n", "LOG_LEVEL_INFO"),
        ("\n", "LOG_LEVEL_INFO"),
        ("", "LOG_LEVEL_INFO"),
    ],
)
def test_parse_level(line: str, level: str) -> None:
    assert parse_level(line) == level


def test_levels_at_or_above() -> None:
    assert levels_at_or_above("LOG_LEVEL_WARNING") == (
        "LOG_LEVEL_WARNING",
        "LOG_LEVEL_ERROR",
        "LOG_LEVEL_CRITICAL",
    )
    assert len(levels_at_or_above("LOG_LEVEL_TRACE")) == 6


def test_clip_keeps_short_messages_and_their_newline() -> None:
    assert clip_message("hello\n") == "hello\n"
    assert clip_message("ünïcode ✓\n") == "ünïcode ✓\n"


def test_clip_cuts_long_messages_to_64_kib() -> None:
    clipped = clip_message("é" * MAX_MESSAGE_BYTES + "\n")
    assert len(clipped.encode("utf-8")) <= MAX_MESSAGE_BYTES
    assert clipped.endswith("bytes]\n")
    assert "[clipped: " in clipped


def test_clip_makes_text_postgres_can_store() -> None:
    assert "\x00" not in clip_message("a\x00b\n")
    assert clip_message("lone \udc80 surrogate\n") == "lone ? surrogate\n"
