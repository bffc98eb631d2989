"""gdrive://, staging and checkpoints against Drive as it really behaves (issue 17): pages, names, shortcuts,
Google-native files, timeouts, quotas, lagging listings, shared drives. Each test states the real behaviour the
stand-in reproduces; tests/standins/README.md names the source."""
import logging
import os

import numpy as np
import pytest

import colabkit
import colabkit.gdrive as g
from colabkit.checkpoints.gdrive import DriveApiFolder

from drive_api import FOLDER, ROOT_ID


def dataset(server, path, files: dict, parent=ROOT_ID):
    """Make the folders of ``path`` below ``parent`` and the files {rel: bytes} in the last one; its id."""
    state = server.state
    for part in [p for p in path.split("/") if p]:
        found = [m for m in state.children(parent) if m["title"] == part and m["mimeType"] == FOLDER]
        parent = found[0]["id"] if found else state.add(part, parent, mime=FOLDER)["id"]
    top = parent
    for rel, data in files.items():
        parent = top
        *dirs, name = rel.split("/")
        for d in dirs:
            found = [m for m in state.children(parent) if m["title"] == d and m["mimeType"] == FOLDER]
            parent = found[0]["id"] if found else state.add(d, parent, mime=FOLDER)["id"]
        state.add(name, parent, data=data)
    return top


def staged(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- 1. every page -----------------------------------------------------------------------------------------
def test_a_listing_follows_every_page_token_through_short_and_empty_pages(gdrive, tmp_path):
    files = {f"img/{i:03d}.bin": os.urandom(10 + i) for i in range(23)} | {"labels.csv": b"a,b\n"}
    dataset(gdrive, "data/set", files)
    gdrive.page_cap, gdrive.short_pages = 4, True     # Drive may send pages shorter than asked, even empty
    out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True)
    assert staged(out) == files
    assert gdrive.pages_served > 8


def test_a_folder_of_more_than_a_thousand_files_lists_whole(gdrive):
    state = gdrive.state
    folder = state.add("big", mime=FOLDER)["id"]
    for i in range(1005):
        state.add(f"f{i:04d}", folder, data=b"")
    client = g.connect()
    assert len(client.children(folder)) == 1005       # Drive's page holds at most 1000 whatever is asked


def test_checkpoint_listings_see_every_checkpoint_across_pages(gdrive, tmp_path):
    with colabkit.Checkpoints("gdrive://runs/p", local_dir=tmp_path / "local", keep=10) as ckpt:
        for step in (1, 2, 3, 4):
            ckpt.save(step, {"w": np.full(3, step)}, wait=True)
    gdrive.page_cap, gdrive.short_pages = 1, True
    assert [c.step for c in DriveApiFolder("runs/p", g.connect(fresh=True)).committed()] == [1, 2, 3, 4]
