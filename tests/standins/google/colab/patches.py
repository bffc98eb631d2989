"""Stand-in for google.colab.patches: ``cv2_imshow``.

The real function clips to 0..255, converts BGR(A) to RGB(A) with OpenCV and displays a PIL image. The stand-in
does the same conversion with numpy, records the call (shape, dtype) and displays the image as PNG, so neither
OpenCV nor Pillow is needed.
"""
import struct
import zlib

from google.colab._standin import record

__all__ = ["cv2_imshow"]


def _png(rgb):
    height, width = rgb.shape[:2]
    color_type = 0 if rgb.ndim == 2 else {3: 2, 4: 6}[rgb.shape[2]]
    rows = rgb.reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def cv2_imshow(a):
    """A replacement for cv2.imshow() for use in Jupyter notebooks."""
    import numpy as np
    from IPython.display import Image, display
    record("patches.cv2_imshow", shape=list(a.shape), dtype=str(a.dtype))
    a = a.clip(0, 255).astype("uint8")
    if a.ndim == 3:
        a = a[:, :, [2, 1, 0, 3][: a.shape[2]]]
    display(Image(data=_png(np.ascontiguousarray(a)), format="png"))
