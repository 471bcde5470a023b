import numpy as np
import pytest
from PIL import Image

from vit.data.encoded.images import to_channels


def test_sixteen_bit_grayscale_is_scaled_not_clipped():
    pixels = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    for array in (pixels, pixels.astype(">u2"), pixels.astype(np.int32)):  # 'I;16', 'I;16B', 'I' (PNG's 16 bits)
        assert np.asarray(to_channels(Image.fromarray(array), 1)).tolist() == [[0, 1, 128, 255]]


def test_float_images_in_zero_to_one_are_scaled():
    image = Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32))
    assert np.asarray(to_channels(image, 1)).tolist() == [[0, 128, 255]]


def test_cmyk_becomes_its_rgb():
    cmyk = Image.new("CMYK", (1, 1), (0, 128, 255, 0))
    assert np.asarray(to_channels(cmyk, 3)).tolist() == [[[255, 127, 0]]]


def test_transparency_becomes_black_background():
    rgba = Image.new("RGBA", (2, 1), (200, 100, 50, 255))
    rgba.putpixel((1, 0), (255, 255, 255, 0))  # a fully transparent white pixel
    assert np.asarray(to_channels(rgba, 3)).tolist() == [[[200, 100, 50], [0, 0, 0]]]
    la = Image.new("LA", (1, 1), (200, 128))
    assert np.asarray(to_channels(la, 1)).tolist() == [[100]]  # half-transparent grey over black
    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([255, 255, 255, 10, 20, 30] + [0] * 762)
    palette.putpixel((1, 0), 1)
    palette.info["transparency"] = 0
    assert np.asarray(to_channels(palette, 3)).tolist() == [[[0, 0, 0], [10, 20, 30]]]
    palette_alpha = Image.new("PA", (2, 1), (0, 255))
    palette_alpha.putpalette([10, 20, 30] + [0] * 765)
    palette_alpha.putpixel((1, 0), (0, 0))
    assert np.asarray(to_channels(palette_alpha, 3)).tolist() == [[[10, 20, 30], [0, 0, 0]]]


@pytest.mark.parametrize("mode", ["L", "RGB", "CMYK", "1", "P", "F"])
def test_every_mode_gives_the_requested_channels(mode):
    image = Image.new(mode, (3, 2))
    assert to_channels(image, 1).mode == "L" and to_channels(image, 3).mode == "RGB"


def test_exif_orientation_is_applied():
    image = Image.new("L", (3, 1), 0)
    image.putpixel((0, 0), 255)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    image.info["exif"] = exif.tobytes()
    upright = to_channels(image, 1)
    assert upright.size == (1, 3) and np.asarray(upright)[0, 0] == 255


def test_other_channel_counts_are_refused():
    with pytest.raises(ValueError, match="not 4"):
        to_channels(Image.new("RGB", (1, 1)), 4)
