"""The vendored front-end files are exactly the pinned ones, and the pages use nothing else."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from master.web.common import STATIC_DIR, TEMPLATES_DIR

VENDOR = STATIC_DIR / "vendor"


def manifest() -> dict[str, object]:
    data: dict[str, object] = json.loads((VENDOR / "MANIFEST.json").read_text())
    return data


def test_every_vendored_file_matches_its_manifest_sha256() -> None:
    listed = set()
    for package in manifest()["packages"]:  # type: ignore[attr-defined]
        assert package["version"] and package["licence"]
        assert package["source"] == (
            f"https://registry.npmjs.org/{package['name']}/-/"
            f"{package['name'].split('/')[-1]}-{package['version']}.tgz"
        )
        for file in package["files"]:
            path = VENDOR / file["path"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == file["sha256"], path
            listed.add(path)
        licences = [f for f in package["files"] if f["path"].startswith("LICENSES/")]
        assert licences, f"{package['name']} ships no licence text"
    on_disk = {p for p in VENDOR.rglob("*") if p.is_file() and p.name != "MANIFEST.json"}
    assert on_disk == listed, "every vendored file is in the manifest, and only those"


def test_the_refresh_script_pins_the_same_hashes(repo_root: Path) -> None:
    script = (repo_root / "scripts" / "vendor-frontend.sh").read_text()
    for package in manifest()["packages"]:  # type: ignore[attr-defined]
        assert f"{package['name']}|{package['version']}|" in script
        assert package["integrity"] in script
        for file in package["files"]:
            assert file["sha256"] in script
    if shutil.which("sha256sum"):
        check = subprocess.run(
            ["bash", str(repo_root / "scripts" / "vendor-frontend.sh"), "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert check.returncode == 0, check.stderr


def test_pages_load_only_our_own_static_files() -> None:
    base = (TEMPLATES_DIR / "base.html").read_text()
    sources = re.findall(r'(?:src|href)="\{\{ static\(\'([^\']+)\'\) \}\}"', base)
    assert set(sources) == {
        "favicon.svg",
        "vendor/uPlot.min.css",
        "app.css",
        "vendor/htmx.min.js",
        "vendor/uPlot.iife.min.js",
        "app.js",
    }
    for template in TEMPLATES_DIR.glob("*.html"):
        text = template.read_text()
        assert "<script>" not in text and "http://" not in text and "https://" not in text, template


async def test_static_files_are_served_with_cache_headers(anon: httpx.AsyncClient) -> None:
    login = await anon.get("/ui/login")
    versioned = re.search(r'src="(/ui/static/vendor/htmx\.min\.js\?v=[0-9a-f]+)"', login.text)
    assert versioned
    reply = await anon.get(versioned.group(1))
    assert reply.status_code == 200
    assert reply.content == (VENDOR / "htmx.min.js").read_bytes()
    assert "immutable" in reply.headers["cache-control"]
    plain = await anon.get("/ui/static/app.css")
    assert plain.headers["cache-control"] == "no-cache"
    assert (await anon.get("/ui/static/nope.js")).status_code == 404
    assert (await anon.get("/ui/static/../common.py")).status_code == 404
