"""A page as a person sees it: headless Chromium takes a screenshot of an HTML file, and
:func:`pixels` reads the PNG back (8-bit RGB or RGBA, not interlaced: what Chromium writes) in
pure Python, for a test to count the colours a drawing shows.

Chromium is Debian's ``chromium`` package (``apt-get install chromium``), run with
``--headless --no-sandbox``; .ci/run requires it, as it requires valgrind."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

__all__ = ["CHROMIUM_HINT", "chromium", "pixels", "screenshot"]

CHROMIUM_HINT = ("headless Chromium is needed for the screenshot (apt-get install chromium; "
                 ".ci/run requires it)")


def chromium() -> str | None:
    """The Chromium executable on PATH, if any."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def screenshot(page: Path, png: Path, *, width: int, height: int) -> Path:
    """A ``width`` × ``height`` screenshot of ``page`` (an HTML file) into ``png``."""
    exe = chromium()
    assert exe is not None, CHROMIUM_HINT
    done = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", f"--user-data-dir={png.parent / 'chromium-profile'}",
         f"--window-size={width},{height}", f"--screenshot={png}", page.as_uri()],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0 and png.is_file(), done.stdout + done.stderr
    return png


def pixels(png: Path) -> Counter[tuple[int, int, int]]:
    """How many pixels of each RGB colour ``png`` has."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    counts: Counter[tuple[int, int, int]] = Counter()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                predictor = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + predictor) & 0xFF
        for x in range(0, stride, channels):
            counts[(line[x], line[x + 1], line[x + 2])] += 1
        previous = line
    return counts
