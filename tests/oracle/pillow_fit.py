#!/usr/bin/python3
"""Pillow as the image oracle (tests/image_pillow_oracle_test.cpp): for each line "FILE WIDTH HEIGHT"
of the manifest, what the reference's load_image does to the image before normalising it:
Image.open(FILE).convert("RGB") written to FILE.rgb, and ImageOps.pad to WIDTH x HEIGHT with grey
(127, 127, 127) written to FILE.fit, both as raw RGB8 rows. Debian's python3-pil (scripts/setup.sh)."""
import sys

import PIL
from PIL import Image, ImageOps

for line in open(sys.argv[1]):
    name, width, height = line.split()
    with Image.open(name) as source:
        image = source.convert("RGB")
    open(name + ".rgb", "wb").write(image.tobytes())
    fitted = ImageOps.pad(image, (int(width), int(height)), color=(127, 127, 127))
    open(name + ".fit", "wb").write(fitted.tobytes())
print(PIL.__version__)
