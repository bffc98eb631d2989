"""The fault campaigns (campaign.py, gdrive_campaign.py): every filesystem operation of a save+retention cycle and
of a restore fails in turn (EIO, ENOTCONN, ENOSPC, ETIMEDOUT; on a Drive-like mount, where saves are staged
locally, and on a local-disk one, written directly), the mount drops at each one, and a kill -9 lands at
each one; on gdrive:// every Drive API request fails in turn (5xx, a dropped connection, a lagging listing, an
outage). A fresh process must then restore the newest verified checkpoint, nothing committed and kept may be
gone, and a restore under a fault either restores the newest checkpoint or raises: never starts over silently."""
import os

import pytest

from tests.checkpoints import campaign
from tests.standins.drive_mount import fuse_unavailable_reason

pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.subprocess_kill,
              pytest.mark.skipif(bool(fuse_unavailable_reason()), reason=f"FUSE: {fuse_unavailable_reason()}")]


def test_every_operation_of_a_save_and_a_restore_fails_in_turn_and_nothing_is_lost(tmp_path):
    # more workers than cores: some trials mostly wait (a restore's read timeout, a lease watched for renewals),
    # and another worker's trial uses the core meanwhile
    result = campaign.run_campaign(tmp_path, workers=min(8, 2 * (os.cpu_count() or 2)))
    ops = result["operations"]
    # the cycles really went through the mount
    assert ops["save"] > 50 and ops["save-local"] > 50 and ops["restore"] > 20, ops
    # a Drive-like mount is written through local staging; a local disk directly, nothing staged
    assert result["staged"]["save"] and result["staged"]["save-local"] == [], result["staged"]
    trials = result["trials"]
    for cycle, n in ops.items():   # every operation of every cycle, each kind of fault
        for kind in campaign.KINDS:
            covered = {t["k"] for t in trials if t["cycle"] == cycle and t["kind"] == kind}
            assert covered >= set(range(1, n + 1)), (cycle, kind, sorted(set(range(1, n + 1)) - covered))
    kills = [t for t in trials if t["kind"] == "kill"]
    assert all(t["exit"] == -9 for t in kills), "kill-at must really kill the trial at its operation"
    bad = [t for t in trials if t["outcome"] != "ok"]
    assert not bad, "\n" + campaign.table(result) + "\n" + "\n".join(
        f"{t['cycle']} {t['kind']} k={t['k']}: {t['outcome']}: {t['detail']}" for t in bad[:30])


def test_every_drive_api_request_of_a_save_and_a_restore_fails_in_turn_and_nothing_is_lost(tmp_path):
    pytest.importorskip("pydrive2")
    from tests.checkpoints import gdrive_campaign
    result = gdrive_campaign.run_campaign(tmp_path, workers=4)
    ops = result["operations"]
    assert ops["save"] > 20 and ops["restore"] > 8, ops   # the cycles really went through the API
    trials = result["trials"]
    assert len(trials) == len(gdrive_campaign.KINDS) * (ops["save"] + ops["restore"]), sorted(ops)
    bad = [t for t in trials if t["outcome"] != "ok"]
    assert not bad, "\n" + gdrive_campaign.table(result) + "\n" + "\n".join(
        f"{t['cycle']} {t['kind']} k={t['k']}: {t['outcome']}: {t['detail']}" for t in bad[:30])
