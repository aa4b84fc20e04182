"""Every mode a PIL decoder gives, as the 8-bit RGB the loader hands over, with the source's full range kept.

PIL's ``convert("RGB")`` clips deeper images instead of scaling them: a 16-bit grey PNG (mode ``I;16``) whose values
span 0..65535 trains as an almost white image (min 248, mean 255 for a full-range gradient), and a float image in
[0, 1] as an almost black one. So the deep modes are scaled here first, by the range of their kind:

- 16-bit grey (``I;16``, ``I;16B``, ``I;16L``, ``I;16N``: PNG, TIFF) and 32-bit integer grey holding 0..65535 (``I``:
  PIL's mode for 16-bit PGM, whose other maxvals it scales to 65535, and for signed or 32-bit TIFF samples) keep
  their high byte (v >> 8), which is what PIL itself does to 16-bit RGB and grey + alpha PNGs and TIFFs (it opens
  those as 8-bit ``RGB``/``RGBA``), so both kinds of 16-bit file come out alike. An ``I`` image with values outside
  0..65535 (signed or 32-bit data) has no brightness scale to map: it is refused.
- float grey (``F``, TIFF) holding [0, 1]: x 255, rounded. Other values (HDR, depth maps, NaN) are refused.
- transparency, an alpha channel (``RGBA``, ``LA``, ``PA``, premultiplied ``La``/``RGBa``) or a transparent colour
  (``info["transparency"]`` of a ``P``, ``L``, ``RGB`` or ``I;16`` PNG, a GIF), is composited on white, as a viewer
  shows it (a transparent pixel's hidden colour is often black).
- the rest (``1``, ``L``, ``P``, ``RGB``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``) through PIL's own conversion, which
  is right for them. Colour profiles (ICC) are not applied: pixels are taken as sRGB.

A refusal is a ``ValueError``: the sources skip the image and count it like an unreadable one (``data/skipped``,
``data.max_bad_fraction``), with the reason in the record.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

SIXTEEN_BIT_GREY = ("I;16", "I;16B", "I;16L", "I;16N", "I")
ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
BACKGROUND = (255, 255, 255, 255)  # what transparency is composited on


def eight_bit_grey(image: Image.Image) -> np.ndarray:
    """The 8-bit grey pixels of a 16-bit, 32-bit integer or float grey image (see the module's docstring)."""
    values = np.asarray(image)
    if image.mode == "F":
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 1:
            raise ValueError(
                f"float pixels in [{values.min():.4g}, {values.max():.4g}], not [0, 1]: no brightness scale to map"
            )
        return np.rint(values * 255).astype(np.uint8)
    if values.min() < 0 or values.max() > 65535:
        raise ValueError(
            f"{image.mode} pixels in [{values.min()}, {values.max()}], not 0..65535 (signed or 32-bit samples): no "
            "brightness scale to map"
        )
    return (values.astype(np.uint32) >> 8).astype(np.uint8)


def deep_grey_to_8_bit(image: Image.Image) -> Image.Image:
    """``L``, or ``LA`` where a transparent grey value (a 16-bit PNG's tRNS chunk) marks pixels as transparent."""
    grey = Image.fromarray(eight_bit_grey(image), "L")
    transparent = image.info.get("transparency")
    if not isinstance(transparent, int) or image.mode == "F":
        return grey
    alpha = np.where(np.asarray(image) == transparent, 0, 255).astype(np.uint8)
    return Image.merge("LA", (grey, Image.fromarray(alpha, "L")))


def to_rgb(image: Image.Image) -> Image.Image:
    """Any decoded image -> 8-bit RGB at its full range, transparency composited on white; a ``ValueError`` for an
    image whose pixels have no defined scale (see the module's docstring)."""
    if image.mode in SIXTEEN_BIT_GREY or image.mode == "F":
        image = deep_grey_to_8_bit(image)
    elif image.mode == "La":  # premultiplied: PIL converts it to RGBA only through LA
        image = image.convert("LA")
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, BACKGROUND), rgba)
    return image.convert("RGB")
