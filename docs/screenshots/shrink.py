"""Shrink the dashboard's page screenshots for the README: 800 px wide, a 64-colour palette.

    python docs/screenshots/shrink.py [DIR]   (default: this directory; every *.png in place)
"""

import sys
from pathlib import Path

from PIL import Image

WIDTH, COLOURS, MAX_HEIGHT = 800, 64, 3200


def shrink(path: Path) -> None:
    im = Image.open(path).convert("RGB")
    if im.width > WIDTH:
        im = im.resize((WIDTH, round(im.height * WIDTH / im.width)), Image.LANCZOS)
    im = im.crop((0, 0, im.width, min(im.height, MAX_HEIGHT)))
    im.quantize(colors=COLOURS, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


if __name__ == "__main__":
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    for png in sorted(folder.glob("*.png")):
        shrink(png)
        print(f"{png}: {png.stat().st_size // 1024} KiB")
