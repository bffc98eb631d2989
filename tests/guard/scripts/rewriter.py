"""Rewrites last.pt in place all the time, as a script calling torch.save in a tight loop does (a zip archive,
truncated and written again through the same inode), with short pauses now and then. Each version holds its
number and a payload made of that number only, so a copy mixing two versions is plain to see."""
import os
import random
import sys
import time
import zipfile

out, seconds = sys.argv[1], float(sys.argv[2])
os.makedirs(out, exist_ok=True)
path = os.path.join(out, "last.pt")
rng = random.Random(0)
end, version = time.monotonic() + seconds, 0
while time.monotonic() < end:
    version += 1
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:   # opened "wb": truncated, same inode
        zf.writestr("archive/version", str(version))
        zf.writestr("archive/data.pkl", bytes([version % 251]) * (256 * 1024))
    if version % 4 == 0:
        time.sleep(rng.uniform(0.05, 0.3))
print(f"wrote {version} versions", flush=True)
