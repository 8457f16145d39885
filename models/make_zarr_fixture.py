#!/usr/bin/env python3
"""Small zarr v2 stores for wxe's zarr reader (tests/data/zarr/), written by the zarr Python
package (zarr_format=2) with each codec real ERA5 stores use, and the values they hold as .npy
files written by numpy (the tests' oracle):

- none.zarr, blosc.zarr (lz4, byte shuffle), zstd.zarr, zlib.zarr, gzip.zarr, each a group with
  the same arrays (xarray's _ARRAY_DIMENSIONS attributes):
  f  float32 (3, 5, 7), chunks (2, 3, 4): partial edge chunks in every dimension;
  d  big-endian float64 (4,), chunks (3,);
  i  int16 (5, 7) with negative values, one chunk;
  u  uint8 (6,), chunks (4,);
  m  float32 (3, 4), fill_value -9999, two elements equal to it (read as NaN);
  s  float32 (4, 6), chunks (2, 3), '/' as the dimension separator (zstd.zarr only)
- era5_blosc.zarr: the era5_tiny 2021 fields (tests/data/era5_tiny/era5_2021.zarr, written by
  ncgen/NCZarr uncompressed) rewritten by xarray with blosc-zstd, as an ERA5 store is written:
  time encoded by xarray (int64 hours), float fields compressed.
- expected_<array>.npy: the values as xarray reads them (float64; NaN where an element equals the
  array's fill_value, zarr's default 0 included, as xarray decodes them for CREDIT).
Usage: python models/make_zarr_fixture.py [OUT_DIR]
"""
import os
import shutil
import sys

import numcodecs
import numpy as np
import zarr

HERE = os.path.dirname(os.path.abspath(__file__))


def arrays():
    rng = np.random.default_rng(23)
    m = rng.normal(size=(3, 4)).astype(np.float32)
    m[0, 1] = m[2, 3] = -9999
    return {
        "f": (rng.normal(280, 20, size=(3, 5, 7)).astype(np.float32), (2, 3, 4), ["time", "lat", "lon"], None),
        "d": (rng.normal(size=4).astype(">f8"), (3,), ["level"], None),
        "i": (rng.integers(-30000, 30000, size=(5, 7)).astype(np.int16), (5, 7), ["lat", "lon"], None),
        "u": (rng.integers(0, 255, size=6).astype(np.uint8), (4,), ["x"], None),
        "m": (m, (3, 4), ["lat3", "lon4"], -9999.0),
    }


def write(path, compressor, slash=False):
    shutil.rmtree(path, ignore_errors=True)
    g = zarr.open_group(path, mode="w", zarr_format=2)
    g.attrs["title"] = "wxe zarr fixture"
    items = list(arrays().items())
    if slash:
        items.append(("s", (np.arange(24, dtype=np.float32).reshape(4, 6), (2, 3), ["lat4", "lon6"], None)))
    for name, (v, chunks, dims, fill) in items:
        kw = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if name == "s" else {}
        a = g.create_array(name, shape=v.shape, chunks=chunks, dtype=v.dtype, compressors=compressor,
                           fill_value=fill if fill is not None else 0, **kw)
        a[...] = v
        a.attrs["_ARRAY_DIMENSIONS"] = dims
        a.attrs["units"] = "K" if name == "f" else "1"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "data", "zarr")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "none.zarr"), None)
    write(os.path.join(out, "blosc.zarr"), numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE))
    write(os.path.join(out, "zstd.zarr"), numcodecs.Zstd(level=3), slash=True)
    write(os.path.join(out, "zlib.zarr"), numcodecs.Zlib(level=6))
    write(os.path.join(out, "gzip.zarr"), numcodecs.GZip(level=6))
    # the values as xarray (CREDIT's reader) decodes them: elements equal to an array's
    # fill_value are missing (NaN), zarr's default fill_value 0 included
    import xarray as xr

    ds = xr.open_zarr(os.path.join(out, "zstd.zarr"), consolidated=False)
    for name in list(arrays()) + ["s"]:
        np.save(os.path.join(out, f"expected_{name}.npy"), ds[name].values.astype(np.float64))
    # an ERA5 store as xarray writes one, compressed

    src = os.path.join(HERE, "..", "tests", "data", "era5_tiny", "era5_2021.zarr")
    ds = xr.open_zarr(src, consolidated=False)
    enc = {v: {"compressors": (numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE),)}
           for v in ("T", "U", "SP", "tp")}
    dst = os.path.join(out, "era5_blosc.zarr")
    shutil.rmtree(dst, ignore_errors=True)
    ds.to_zarr(dst, zarr_format=2, consolidated=True, encoding=enc)
    print("written to", out)


if __name__ == "__main__":
    main()
