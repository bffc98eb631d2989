"""gdrive://, staging and checkpoints against Drive as it really behaves (issue 17): pages, names, shortcuts,
Google-native files, timeouts, quotas, lagging listings, shared drives. Each test states the real behaviour the
stand-in reproduces; tests/standins/README.md names the source."""
import logging
import os
import time

import numpy as np
import pytest
from tests.standins.drive_api import FOLDER, ROOT_ID

import colabkit
import colabkit.gdrive as g
from colabkit.checkpoints.drive_api import DriveApiFolder


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


# -- 2. names that are not safe local paths ---------------------------------------------------------------
def test_staging_skips_drive_names_that_would_escape_or_nest_and_names_each(gdrive, tmp_path, caplog):
    state = gdrive.state
    top = dataset(gdrive, "data/set", {"ok/1.bin": b"one", "2.bin": b"two"})
    up = state.add("..", top, mime=FOLDER)["id"]           # Drive allows a folder named ".."
    state.add("evil.bin", up, data=b"x")
    state.add("../escape.bin", top, data=b"y")             # and "/" inside a title
    state.add("a/b.bin", top, data=b"z")
    state.add(".", top, data=b"w")
    out = tmp_path / "stage" / "out"
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        colabkit.stage("gdrive://data/set", out, quiet=True)
    assert staged(out) == {"ok/1.bin": b"one", "2.bin": b"two"}
    assert sorted(p.name for p in (tmp_path / "stage").iterdir()) == ["out", "out.colabkit-stage"]
    assert not (tmp_path / "evil.bin").exists() and not (tmp_path / "stage" / "escape.bin").exists()
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 4
    for name in ("gdrive://data/set/..", "gdrive://data/set/../escape.bin", "gdrive://data/set/a/b.bin",
                 "gdrive://data/set/."):
        assert any(f" {name} (Drive id" in m for m in skipped), (name, skipped)


def test_names_a_local_disk_cannot_hold_are_skipped_with_a_warning_and_the_rest_is_staged(gdrive, tmp_path, caplog):
    state = gdrive.state
    top = dataset(gdrive, "data/set", {"ok.bin": b"ok", "sub/in.bin": b"in"})
    too_long = "\u00e9" * 128 + ".bin"                     # 132 characters, 260 bytes: over 255 bytes
    state.add(too_long, top, data=b"long")
    long_folder = "d" * 256
    state.add("f.bin", state.add(long_folder, top, mime=FOLDER)["id"], data=b"f")
    near = "n" * 250 + ".bin"                                # a file name, but too long for a name + a suffix
    state.add(near, top, data=b"near")
    deep, parent = [], top                                   # every name fits; the path does not (4096 bytes)
    for i in range(17):
        deep.append(f"{i:02d}" + "p" * 240)
        parent = state.add(deep[-1], parent, mime=FOLDER)["id"]
    state.add("deep.bin", parent, data=b"deep")
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        assert colabkit.stage("gdrive://data/set", out, quiet=True) == out
    assert staged(out) == {"ok.bin": b"ok", "sub/in.bin": b"in", near: b"near"}
    assert not [p for p in out.rglob("*") if p.is_dir() and not any(p.iterdir())], "no empty folder left behind"
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    for name in (too_long, long_folder, "/".join(deep) + "/deep.bin"):
        assert sum(f"gdrive://data/set/{name}" in m for m in skipped) == 1, (name[:40], skipped)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="colabkit"):    # unchanged: a cache hit, the skips named again
        assert colabkit.stage("gdrive://data/set", out, quiet=True) == out
    assert sum("deep.bin" in r.getMessage() for r in caplog.records) == 1


def test_a_file_and_a_folder_of_the_same_name_both_land_the_file_renamed(gdrive, tmp_path, caplog):
    state = gdrive.state
    top = dataset(gdrive, "data/set", {"labels/a.bin": b"a", "train.csv": b"rows"})
    state.add("labels", top, data=b"the file")               # made after the folder of that name
    state.add("x.bin", state.add("train.csv", top, mime=FOLDER)["id"], data=b"x")   # and before
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True)
    assert staged(out) == {"labels/a.bin": b"a", "labels (1)": b"the file", "train.csv/x.bin": b"x",
                           "train (1).csv": b"rows"}
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "gdrive://data/set/labels" in text and "labels (1)" in text and "train (1).csv" in text
    assert colabkit.stage("gdrive://data/set", out, quiet=True) == out and staged(out)["labels (1)"] == b"the file"


def test_a_checkpoint_whose_manifest_lists_a_path_outside_it_is_not_restored(gdrive, tmp_path):
    from colabkit.checkpoints import manifest as m
    with colabkit.Checkpoints("gdrive://runs/t", local_dir=tmp_path / "local") as ckpt:
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    state = gdrive.state
    root = state.find("runs/t")["id"]
    evil = state.add("ckpt-000000000009-abcdef", root, mime=FOLDER)["id"]
    payload = b"not yours"
    import blake3
    files = {"../../outside.bin": {"size": len(payload), "blake3": blake3.blake3(payload).hexdigest()}}
    state.add("MANIFEST.json", evil, data=m.dumps(m.build(step=9, epoch=None, batch=None, files=files)))
    parent = evil
    for _ in range(2):
        parent = state.add("..", parent, mime=FOLDER)["id"]
    state.add("outside.bin", parent, data=payload)
    import shutil
    shutil.rmtree(tmp_path / "local")
    restored = colabkit.Checkpoints("gdrive://runs/t", local_dir=tmp_path / "local").restore()
    assert restored.step == 1
    assert not list(tmp_path.rglob("outside.bin"))
    with pytest.raises(m.ManifestError, match="outside"):
        m.loads(m.dumps(m.build(step=9, epoch=None, batch=None, files=files)))


# -- 8. Drive's `title =` ignores case; colabkit's names do not ---------------------------------------------
def test_a_folder_differing_only_in_case_is_named_in_an_error_not_shadowed_by_a_new_one(gdrive, tmp_path):
    state = gdrive.state
    existing = state.add("Runs", mime=FOLDER)["id"]      # made before names became case-sensitive
    state.add("a", existing, mime=FOLDER)
    client = g.connect()
    for create in (True, False):
        with pytest.raises(g.DriveError, match="My Drive/runs .*My Drive/Runs.*exact name"):
            client.folder("runs/a", create=create)
    assert [m["title"] for m in state.children(ROOT_ID)] == ["Runs"], "no 'runs' folder is made beside 'Runs'"
    assert client.folder("Runs/a", create=False) == state.find("Runs/a")["id"]
    dataset(gdrive, "data/Set", {"x.bin": b"x"})
    with pytest.raises(FileNotFoundError, match="gdrive://data/set"):
        colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True)


# -- twin folders: one rule everywhere, never deleted ---------------------------------------------------------
def test_of_twin_folders_every_lookup_uses_the_one_holding_checkpoints_not_the_newest(gdrive, tmp_path, caplog):
    state = gdrive.state
    with colabkit.Checkpoints("gdrive://runs/p", local_dir=tmp_path / "local") as ckpt:
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    kept = state.find("runs")["id"]
    twin = state.add("runs", mime=FOLDER)["id"]           # a newer, empty twin (another process, a lagging listing)
    state.add("p", twin, mime=FOLDER)
    client = g.connect(fresh=True)
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        got = client.folder("runs", create=True)
    assert got == kept
    warned = [r.getMessage() for r in caplog.records if "folders named 'runs'" in r.getMessage()]
    assert len(warned) == 1 and kept in warned[0] and twin in warned[0]
    import shutil
    shutil.rmtree(tmp_path / "local")
    assert colabkit.Checkpoints("gdrive://runs/p", local_dir=tmp_path / "local").restore().step == 1
    assert twin in state.files and kept in state.files


def test_a_twin_folder_is_never_deleted_even_when_a_lagging_listing_shows_it_empty(gdrive, monkeypatch):
    state = gdrive.state
    older = state.add("runs", mime=FOLDER)["id"]
    client = g.connect()
    monkeypatch.setattr(g, "CREATE_CHECK_S", 0.05, raising=False)
    mine = client.mkdir(ROOT_ID, "runs")                  # made while a lagging listing hid the older one
    import time
    time.sleep(0.5)
    state.add("lease.json", mine["id"], data=b"{}")       # a third process writes into it during the check
    gdrive.listing_lag_s = 0.4                             # ... which the listing does not show yet
    client._settle(ROOT_ID, "runs", mine, "My Drive")
    assert mine["id"] in state.files and not state.files[mine["id"]]["labels"]["trashed"]
    assert [m["title"] for m in state.children(mine["id"])] == ["lease.json"]
    assert older in state.files


# -- gdrive://id:<id> and bare ids that do not resolve ---------------------------------------------------------
def test_an_id_that_does_not_resolve_is_an_error_naming_it_and_nothing_is_created(gdrive, tmp_path):
    state = gdrive.state
    gone = state.add("gone", mime=FOLDER)["id"]
    link = state.add_shortcut("link", gone)["id"]
    state.delete(gone)
    missing = "1" + "Z" * 32
    client = g.connect()
    for first in (f"id:{missing}", f"id:{link}", missing, link):
        with pytest.raises(g.DriveError, match=f"id {first.removeprefix('id:')}.*(another Google account|not shared)"):
            client.locate(f"{first}/runs")
        with pytest.raises(OSError), colabkit.Checkpoints(f"gdrive://{first}/runs", local_dir=tmp_path / "l") as ckpt:
            ckpt.restore()
            ckpt.save(1, {"w": np.ones(3)}, wait=5)
            raise OSError(ckpt.status.last_error)
    titles = [m["title"] for m in state.files.values() if not m["labels"]["trashed"]]
    assert not [t for t in titles if missing in t or link in t or t == "runs"], titles
    named = state.add(missing, mime=FOLDER)["id"]         # a My Drive folder literally named like an id
    assert client.locate(f"{missing}/runs") == ("root", f"{missing}/runs", "")
    assert client.folder(f"{missing}", create=False) == named


# -- pages: a repeated page token ------------------------------------------------------------------------------
def test_a_repeated_page_token_stops_the_listing_with_an_error_and_items_are_not_doubled(gdrive, monkeypatch):
    state = gdrive.state
    folder = state.add("many", mime=FOLDER)["id"]
    for i in range(5):
        state.add(f"f{i}", folder, data=b"")
    client = g.connect()
    gdrive.page_cap = 2
    assert sorted(m["title"] for m in client.children(folder)) == [f"f{i}" for i in range(5)]
    from tests.standins import drive_api
    monkeypatch.setattr(drive_api, "_page_token", lambda start, page_no: "SAME")   # Drive sends one token again
    monkeypatch.setattr(drive_api, "_read_page_token", lambda token: (0, 0))
    with pytest.raises(g.DriveError, match="same page token"):
        client.children(folder)


# -- 4. shortcuts --------------------------------------------------------------------------------------------
def test_a_shortcut_to_a_shared_folder_is_used_not_shadowed_by_a_new_folder(gdrive, tmp_path):
    state = gdrive.state
    elsewhere = state.add("someone else's drive", parent="0AOTHERUSER", mime=FOLDER)["id"]   # not in My Drive
    shared = state.add("team-runs", elsewhere, mime=FOLDER)["id"]
    state.add_shortcut("runs", shared)                   # "Add shortcut to Drive": My Drive/runs -> team-runs
    with colabkit.Checkpoints("gdrive://runs/a", local_dir=tmp_path / "local") as ckpt:
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    assert [m["title"] for m in state.children(ROOT_ID)] == ["runs"]      # no folder made beside the shortcut
    a = [m for m in state.children(shared) if m["title"] == "a"]
    assert len(a) == 1 and next(m["title"] for m in state.children(a[0]["id"])).startswith("ckpt-")
    import shutil
    shutil.rmtree(tmp_path / "local")
    assert colabkit.Checkpoints("gdrive://runs/a", local_dir=tmp_path / "local").restore().step == 1


def test_staging_follows_shortcuts_to_files_and_folders(gdrive, tmp_path, caplog):
    state = gdrive.state
    top = dataset(gdrive, "data/set", {"own.bin": b"own"})
    lib = state.add("library", parent="0AOTHERUSER", mime=FOLDER)["id"]
    extra = state.add("extra", lib, mime=FOLDER)["id"]
    state.add("e.bin", extra, data=b"extra")
    big = state.add("big.bin", lib, data=b"big file")
    state.add_shortcut("extra", extra, top)
    state.add_shortcut("big-link.bin", big["id"], top)
    state.add_shortcut("loop", top, top)                 # a shortcut back to the folder itself
    gone = state.add("gone.bin", lib, data=b"")
    state.add_shortcut("gone.bin", gone["id"], top)
    state.delete(gone["id"])
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True)
    assert staged(out) == {"own.bin": b"own", "extra/e.bin": b"extra", "big-link.bin": b"big file"}
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "gdrive://data/set/loop" in text and "gdrive://data/set/gone.bin" in text
    state.add_shortcut("linked", top, state.find("data")["id"])          # the dataset itself through a shortcut
    assert staged(colabkit.stage("gdrive://data/linked", tmp_path / "out2", quiet=True)) == staged(out)


def shortcut_lattice(server, path, depth):
    """A shared folder of ``depth`` levels where each level holds a file and two shortcuts ("a", "b") to the next
    level: 2**depth paths lead to the last level."""
    state = server.state
    top = dataset(server, path, {"f0.bin": b"level 0"})
    levels = [top] + [state.add(f"level {k}", parent="0AOTHERUSER", mime=FOLDER)["id"] for k in range(1, depth + 1)]
    for k in range(1, depth + 1):
        state.add(f"f{k}.bin", levels[k], data=f"level {k}".encode())
        state.add_shortcut("a", levels[k], levels[k - 1])
        state.add_shortcut("b", levels[k], levels[k - 1])
    return top


def test_a_lattice_of_shortcuts_is_walked_once_per_folder_with_the_repeats_named(gdrive, tmp_path, caplog):
    g.connect()
    requests = {}
    for depth in (6, 12):
        shortcut_lattice(gdrive, f"data/lattice{depth}", depth)
        gdrive.reset_count()
        with caplog.at_level(logging.WARNING, logger="colabkit"):
            out = colabkit.stage(f"gdrive://data/lattice{depth}", tmp_path / f"out{depth}", quiet=True)
        requests[depth] = gdrive.count
        files = staged(out)                    # each folder's files once, under one of the paths that reach it
        assert sorted(files.values()) == sorted(f"level {k}".encode() for k in range(depth + 1))
        assert all(rel.count("/") == int(data.split()[1]) for rel, data in ((r, d.decode()) for r, d in files.items()))
    assert requests[12] <= 2 * requests[6], f"requests grow with the number of folders, not of paths: {requests}"
    repeats = [r.getMessage() for r in caplog.records if "lattice12" in r.getMessage()]
    assert len(repeats) == 12 and all("already staged there" in m for m in repeats), repeats


# -- 7. Google-native files inside a dataset ---------------------------------------------------------------
def test_google_docs_and_sheets_in_a_dataset_are_skipped_with_one_line_each(gdrive, tmp_path, caplog):
    from tests.standins.drive_api import DOCUMENT, SPREADSHEET
    state = gdrive.state
    top = dataset(gdrive, "data/set", {"a.bin": b"a", "sub/b.bin": b"b"})
    state.add("README", top, mime=DOCUMENT)               # alt=media answers 403 fileNotDownloadable
    state.add("labels", state.find("data/set/sub")["id"], mime=SPREADSHEET)
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True)
    assert staged(out) == {"a.bin": b"a", "sub/b.bin": b"b"}
    lines = [r.getMessage() for r in caplog.records if "no file to download" in r.getMessage()]
    assert len(lines) == 2
    assert any("gdrive://data/set/README" in m and "Google Docs document" in m for m in lines)
    assert any("gdrive://data/set/sub/labels" in m and "Google Sheets spreadsheet" in m for m in lines)
    caplog.clear()                                        # a second stage is a cache hit: same entries
    assert colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True) == out


# -- 6. timeouts ---------------------------------------------------------------------------------------------
def finishes(fn, within=30.0):
    """fn()'s result, asserting it returns within ``within`` seconds (a call that hangs fails the test, not CI)."""
    import threading
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), f"still waiting after {within} s: a request without a timeout"
    if "error" in box:
        raise box["error"]
    return box["value"]


def test_a_drive_request_that_is_never_answered_times_out_and_is_retried(gdrive, tmp_path, monkeypatch):
    monkeypatch.setattr(g, "TIMEOUT_S", 0.5, raising=False)
    dataset(gdrive, "data/set", {"a.bin": b"a" * 1000, "b.bin": b"b"})
    g.connect()
    gdrive.stall(method="GET", path="/drive/v2/files", times=1)          # a listing: half-open connection
    out = finishes(lambda: colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True))
    assert staged(out) == {"a.bin": b"a" * 1000, "b.bin": b"b"} and gdrive.stalled
    gdrive.arm(1, "hang")                                                # the campaign's form: the k-th request
    assert len(finishes(lambda: g.connect().children(gdrive.state.find("data/set")["id"]))) == 2
    assert [i[1] for i in gdrive.injected] == ["hang"]
    gdrive.stall(method="PUT", path="/upload", times=1)                  # an upload chunk
    gdrive.stall(method="GET", path="/drive/v2/files/", times=1)         # a download

    def cycle():
        with colabkit.Checkpoints("gdrive://runs/t", local_dir=tmp_path / "local") as ckpt:
            assert ckpt.save(1, {"w": np.ones(3)}, wait=20)
        import shutil
        shutil.rmtree(tmp_path / "local")
        return colabkit.Checkpoints("gdrive://runs/t", local_dir=tmp_path / "local").restore()
    assert finishes(cycle, 60).step == 1
    assert len(gdrive.stalled) == 3


def test_a_share_link_that_is_never_answered_times_out_and_is_retried(tmp_path, links, monkeypatch):
    from colabkit.gdrive import links as L
    monkeypatch.setattr(L, "TIMEOUT_S", 0.5, raising=False)
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    file_id = links.file(src)
    links.server.stall(path="/uc", times=1)
    out = finishes(lambda: L.fetch(f"https://drive.google.com/file/d/{file_id}/view", tmp_path / "got", quiet=True))
    assert out.read_bytes() == b"weights" and links.server.stalled


@pytest.mark.parametrize("timeout", [0.3, 1.5])
def test_timeout_s_set_on_colabkit_gdrive_is_the_wait_for_an_unanswered_request(gdrive, monkeypatch, timeout):
    # README: "Every request has a 60 s timeout (`colabkit.gdrive.TIMEOUT_S`)": setting it there is what counts
    monkeypatch.setattr(g, "TIMEOUT_S", timeout)
    client = g.connect(fresh=True)                     # a client signed in after the change
    folder = gdrive.state.add("t", mime=FOLDER)["id"]
    gdrive.stall(method="GET", path="/drive/v2/files", times=1)
    start = time.monotonic()
    assert client.children(folder) == []               # the listing times out, and its retry is answered
    took = time.monotonic() - start
    assert gdrive.stalled and timeout <= took < timeout + 1.0, took


@pytest.mark.parametrize("window", [0.5, 2.0])
def test_rate_window_s_set_on_colabkit_gdrive_is_how_long_rate_limits_are_retried(gdrive, monkeypatch, window):
    # README: rate-limit answers are retried "for as long as `colabkit.gdrive.RATE_WINDOW_S`", past TRIES attempts
    monkeypatch.setattr(g, "RATE_WINDOW_S", window)
    client = g.connect()
    folder = gdrive.state.add("t", mime=FOLDER)["id"]
    gdrive.quota(0, per_s=60.0)                         # every Drive API request is refused: 403 userRateLimitExceeded
    start = time.monotonic()
    with pytest.raises(g.DriveError, match="userRateLimitExceeded"):
        client.children(folder)
    took = time.monotonic() - start
    assert window <= took < window + 1.0, took
    assert gdrive.rate_limited > g.TRIES


# -- 10. quotas per minute, idempotent creates ---------------------------------------------------------------
def test_sixteen_staging_threads_share_a_per_minute_quota_and_all_get_through(gdrive, tmp_path, monkeypatch):
    monkeypatch.setattr(g, "RATE_WINDOW_S", 20.0, raising=False)    # retry for 20 s (150 s by default)
    files = {f"{i:02d}.bin": os.urandom(50) for i in range(40)}
    dataset(gdrive, "data/set", files)
    g.connect()
    gdrive.quota(12, per_s=2.0)                # Drive's window is a minute; 2 s here, far too few for 16 threads
    out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True, workers=16)
    assert staged(out) == files
    assert gdrive.rate_limited > 16, "the quota was hit, and waited out"


def test_a_folder_create_whose_answer_is_lost_is_not_made_twice(gdrive, tmp_path):
    client = g.connect()
    for k, n in ((1, 2), (2, 3)):   # the n-th request is the create (of "runs", then of "x2"): applied, answer cut
        gdrive.arm(n, "drop-mid")
        made = client.folder(f"runs/x{k}", create=True)
        assert gdrive.injected[-1][1:3] == ("drop-mid", "POST")
        titles = [m["title"] for m in gdrive.state.children(ROOT_ID)]
        assert titles.count("runs") == 1, titles
        inside = [m for m in gdrive.state.children(gdrive.state.find("runs")["id"])]
        assert [m["title"] for m in inside].count(f"x{k}") == 1 and made == gdrive.state.find(f"runs/x{k}")["id"]


# -- 9. listings lag behind creates ---------------------------------------------------------------------------
def test_two_processes_creating_one_folder_path_under_a_lagging_listing_use_one(gdrive, monkeypatch):
    import threading
    monkeypatch.setattr(g, "CREATE_CHECK_S", 1.0, raising=False)
    gdrive.listing_lag_s = 0.5                     # a new item is missing from listings for half a second
    clients = [g.connect(), g.connect(fresh=True)]
    got, barrier = [None, None], threading.Barrier(2)

    def make(i):
        barrier.wait()
        got[i] = clients[i].folder("runs/shared", create=True)
    threads = [threading.Thread(target=make, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    state = gdrive.state
    runs = [m for m in state.children(ROOT_ID) if m["title"] == "runs"]
    assert 1 <= len(runs) <= 2, "a twin may be left (never deleted), but no more"
    assert got[0] == got[1], "both processes use the same folder"
    assert g.connect(fresh=True).folder("runs/shared", create=False) == got[0], "and so does a later lookup"


def test_pruning_under_a_lagging_listing_never_deletes_a_just_uploaded_checkpoint(gdrive, tmp_path):
    gdrive.listing_lag_s = 1.0                     # manifests (and folders) show in listings a second late
    with colabkit.Checkpoints("gdrive://runs/lag", local_dir=tmp_path / "local", keep=2) as ckpt:
        for step in range(1, 6):
            assert ckpt.save(step, {"w": np.full(3, step)}, wait=20)
    import time
    time.sleep(1.1)
    steps = [c.step for c in DriveApiFolder("runs/lag", g.connect(fresh=True)).committed()]
    assert steps[-2:] == [4, 5] and 5 in steps
    import shutil
    shutil.rmtree(tmp_path / "local")
    assert colabkit.Checkpoints("gdrive://runs/lag", local_dir=tmp_path / "local").restore().step == 5


# -- 3. service accounts: no storage of their own; shared drives and folders by id ----------------------------
SA = "ci-bot@test-project.iam.gserviceaccount.com"     # the gdrive fixture's service account


def test_a_service_account_without_storage_gets_a_clear_error_before_the_first_upload(gdrive, tmp_path):
    gdrive.no_quota.add(SA)
    ckpt = colabkit.Checkpoints("gdrive://runs/sa", local_dir=tmp_path / "local")
    ckpt.save(1, {"w": np.ones(3)})
    assert finishes(lambda: ckpt.wait(20)) is False            # wait() returns: no retrying forever
    error = ckpt.status.last_error
    assert "service account" in error and "shared drive" in error and "gdrive://shared:" in error
    assert not [r for r in gdrive.requests if r[1].startswith("/upload/")], "refused before any upload"
    ckpt.close()
    with pytest.raises(g.DriveStorageFull, match="storageQuotaExceeded"):   # what Drive itself answers
        src = tmp_path / "f.bin"
        src.write_bytes(b"x")
        gdrive.reset_count()
        g.connect().upload(src, "root", "f.bin")
    assert gdrive.count == 1, "storageQuotaExceeded is not retried"


def test_a_service_account_writes_into_a_shared_drive_and_a_folder_given_by_id(gdrive, tmp_path):
    import shutil
    gdrive.no_quota.add(SA)
    state = gdrive.state
    team = state.add_drive("Team Drive")
    with colabkit.Checkpoints("gdrive://shared:Team Drive/runs/a", local_dir=tmp_path / "l1") as ckpt:
        assert ckpt.save(1, {"w": np.ones(3)}, wait=20) and ckpt.status.last_error is None
    runs = [m for m in state.children(team) if m["title"] == "runs"]
    assert len(runs) == 1 and runs[0]["driveId"] == team
    shutil.rmtree(tmp_path / "l1")
    assert colabkit.Checkpoints("gdrive://shared:Team Drive/runs/a", local_dir=tmp_path / "l1").restore().step == 1
    folder = state.add("project", team, mime=FOLDER)["id"]       # a folder in it, as its web address names it
    for loc in (f"gdrive://{folder}/b", f"gdrive://id:{folder}/c", f"gdrive://{team}/d"):
        with colabkit.Checkpoints(loc, local_dir=tmp_path / "l2") as ckpt:
            assert ckpt.save(2, {"w": np.ones(3)}, wait=20) and ckpt.status.last_error is None, loc
        shutil.rmtree(tmp_path / "l2")
    assert sorted(m["title"] for m in state.children(folder)) == ["b", "c"]
    assert "d" in [m["title"] for m in state.children(team)]
    assert not [m for m in state.files.values() if m["title"] == "runs" and not m.get("driveId")]
    dataset(gdrive, "x", {"a.bin": b"a"}, parent=folder)        # staging reads through the same locations
    assert staged(colabkit.stage(f"gdrive://{folder}/x", tmp_path / "s1", quiet=True)) == {"a.bin": b"a"}
    assert staged(colabkit.stage("gdrive://shared:Team Drive/project/x", tmp_path / "s2", quiet=True)) == {"a.bin": b"a"}
    with pytest.raises(FileNotFoundError, match="No shared drive named 'Nope'"):
        colabkit.Checkpoints("gdrive://shared:Nope/runs", local_dir=tmp_path / "l3").restore()


# -- 5. (fixed before) a connection dropped mid-answer is retried ----------------------------------------------
def test_a_download_and_a_listing_cut_mid_answer_are_retried(gdrive, tmp_path):
    dataset(gdrive, "data/set", {"a.bin": os.urandom(5000)})
    client = g.connect()
    folder = gdrive.state.find("data/set")["id"]
    gdrive.arm(1, "drop-mid")                                  # a listing: half its JSON, then the connection closes
    assert [i["title"] for i in client.children(folder)] == ["a.bin"]
    gdrive.arm(2, "drop-mid")                                  # the staging's second request (IncompleteRead)
    out = colabkit.stage("gdrive://data/set", tmp_path / "out", quiet=True, workers=1)
    assert (out / "a.bin").read_bytes() == gdrive.state.content[gdrive.state.find("data/set/a.bin")["id"]]
    assert [i[1] for i in gdrive.injected] == ["drop-mid", "drop-mid"]


# -- 11. share links: Google's download quota is reported as such ---------------------------------------------
def test_a_throttled_share_link_is_reported_as_throttled_not_missing(tmp_path, links):
    from colabkit.gdrive import links as L
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    file_id = links.file(src)
    links.server.state.throttled.add(file_id)
    with pytest.raises(L.LinkError, match="too many users have viewed or downloaded") as info:
        L.fetch(f"https://drive.google.com/file/d/{file_id}/view", tmp_path / "got", quiet=True)
    assert "does not exist" not in str(info.value)


# -- 12. smaller: the credentials file, archives from links, a web OAuth client --------------------------------
def test_credentials_are_never_written_through_a_link_planted_at_a_guessable_name(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    path = tmp_path / "cfg" / "drive-credentials.json"
    path.parent.mkdir()
    (path.parent / f".{path.name}.{os.getpid()}.tmp").symlink_to(target)     # the old predictable name
    g.write_private(path, b'{"secret": 1}')
    assert target.read_text() == "keep me" and path.read_bytes() == b'{"secret": 1}'
    assert oct(path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_credentials_file_other_users_can_read_is_made_private_with_a_warning(gdrive, caplog):
    import stat
    import subprocess
    import sys
    os.chmod(gdrive.key, 0o644)
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        g.connect()
    assert stat.S_IMODE(os.stat(gdrive.key).st_mode) == 0o600
    lines = [r.getMessage() for r in caplog.records if str(gdrive.key) in r.getMessage()]
    assert len(lines) == 1 and "0644" in lines[0] and "0600" in lines[0], lines
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        g.connect(fresh=True)
    assert not caplog.records, "a private file: no warning"
    os.chmod(gdrive.key, 0o640)                                  # and from the command line, on stderr
    res = subprocess.run([sys.executable, "-m", "colabkit", "drive", "whoami"], capture_output=True, text=True,
                         env=gdrive.env, timeout=60)
    assert res.returncode == 0 and str(gdrive.key) in res.stderr and "0640" in res.stderr, res.stderr
    assert stat.S_IMODE(os.stat(gdrive.key).st_mode) == 0o600


def test_credentials_are_created_0600_not_made_private_afterwards(tmp_path, monkeypatch):
    import stat

    def refuse(*args, **kwargs):
        raise PermissionError("this file system does not change modes")
    monkeypatch.setattr(os, "chmod", refuse)
    path = tmp_path / "cfg" / "drive-credentials.json"
    g.write_private(path, b'{"secret": 1}')
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b'{"secret": 1}'


def test_an_archive_larger_than_the_free_disk_is_refused_before_extraction(tmp_path, monkeypatch):
    import shutil
    import zipfile

    from colabkit.gdrive import links as L
    arch = tmp_path / "bomb.zip"
    with zipfile.ZipFile(arch, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * (4 << 20))                      # 4 MiB of zeros: a few KiB zipped
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))   # a 1 MiB-free disk
    with pytest.raises(L.LinkError, match="would unpack to"):
        L.extract_archive(arch, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())


def test_a_web_application_oauth_client_is_refused_with_what_to_create(tmp_path):
    import json
    client = tmp_path / "client_secret_web.json"
    client.write_text(json.dumps({"web": {"client_id": "cid", "client_secret": "s", "redirect_uris": ["https://x"]}}))
    with pytest.raises(ValueError, match="Desktop app"):
        g.login(client_secrets=str(client), code_input=lambda prompt: "", out=lambda *a: None)


def test_delete_all_removes_only_the_runs_checkpoints_and_keeps_the_users_files_and_their_folder(gdrive, tmp_path):
    mine = dataset(gdrive, "runs/p", {"notes.txt": b"my notes"})
    for location in ("gdrive://runs/p", "gdrive://runs/q"):
        with colabkit.Checkpoints(location, local_dir=tmp_path / location[-1], keep=10) as ckpt:
            ckpt.save(1, {"w": np.ones(3)}, wait=True)
            ckpt.save(2, {"w": np.ones(3)}, wait=True)
        ckpt.delete_all()
    assert [m["title"] for m in gdrive.state.children(mine)] == ["notes.txt"], "the user's file stays"
    runs = [m for m in gdrive.state.children(ROOT_ID) if m["title"] == "runs"][0]
    assert [m["title"] for m in gdrive.state.children(runs["id"])] == ["p"], "a folder left empty goes"
