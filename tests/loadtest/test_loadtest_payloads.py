"""Contract of loadtest/payloads/ and loadtest/make_payloads.py.

- The folder holds only images, PNG and JPEG both, every one decodable, sized
  from a thumbnail to a 1080p frame, plus a same-sized clip of video frames.
- It stays under 600 KiB, so it fits one ConfigMap even base64-encoded.
- The generator rebuilds the same set (names and pixel sizes) and refuses to
  write more than the budget.
"""

from __future__ import annotations

import make_payloads
from loadtest_support import PAYLOADS
from PIL import Image

BUDGET = 600 * 1024


def sizes(folder) -> dict[str, tuple[str, tuple[int, int]]]:
    out = {}
    for path in sorted(folder.iterdir()):
        with Image.open(path) as img:
            img.load()
            out[path.name] = (img.format, img.size)
    return out


def test_payloads_are_real_images_from_small_to_large():
    found = sizes(PAYLOADS)
    stills = {n: v for n, v in found.items() if n.startswith("img-")}
    frames = {n: v for n, v in found.items() if n.startswith("frame-")}
    assert set(found) == set(stills) | set(frames)
    assert {fmt for fmt, _ in stills.values()} == {"PNG", "JPEG"}
    for name, (fmt, _) in found.items():
        assert name.endswith(".png" if fmt == "PNG" else ".jpg"), name
    areas = sorted(w * h for _, (w, h) in stills.values())
    assert areas[0] <= 64 * 64 and areas[-1] >= 1920 * 1080
    assert len(frames) >= 8 and len({size for _, size in frames.values()}) == 1


def test_payload_folder_fits_a_configmap():
    assert sum(p.stat().st_size for p in PAYLOADS.iterdir()) < BUDGET


def test_generator_rebuilds_the_committed_set(tmp_path):
    assert make_payloads.main(["--out", str(tmp_path)]) == 0
    assert sizes(tmp_path) == sizes(PAYLOADS)


def test_generator_refuses_to_exceed_the_budget(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(make_payloads, "BUDGET_BYTES", 1024)
    assert make_payloads.main(["--out", str(tmp_path)]) == 1
    assert "over the 1024-byte budget" in capsys.readouterr().err
