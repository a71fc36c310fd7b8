"""Downloads CIFAR-10, CIFAR-100, TinyImageNet or ImageNet weights safely.

  python data/download.py --dataset=cifar10        # -> datasets/
  python data/download.py --dataset=cifar100 --format=python --output_dir=d
  python data/download.py --dataset=tinyimagenet \
      --url=http://my-mirror/tiny-imagenet-200.zip
  python data/download.py --weights=resnet18         # -> weights/
  python data/download.py --weights=keras_resnet50   # -> $KERAS_HOME/models/

Only the standard library is used, so this runs before `setup.sh` too.
Why each step is the way it is:

* Slow servers drop connections, so bytes go to `<archive>.part` and a rerun
  (or one of the automatic retries) asks for the rest with an HTTP Range
  request. A server that ignores Range sends the whole file; we start over.
* The md5 of the whole archive is checked before anything is unpacked; a
  mismatch deletes the download, because resuming a corrupt file can never
  fix it. Weight files are checked the way their publishers check them:
  torchvision by the sha256 prefix in the file name, Keras by md5.
* An archive is untrusted input (a mirror can serve anything), so members
  with absolute paths, `..` parts, links, devices or FIFOs are refused
  before a single byte is written, and tar extraction also runs through
  `tarfile`'s `data` filter.
* Unpacking goes to a hidden sibling folder that is renamed into place only
  when complete, with a stamp file inside: a crash never leaves a partial
  dataset that looks finished, and a rerun finds the stamp and does nothing.
  Do not run two downloads into the same `--output_dir` at once.
"""

import argparse
import glob
import hashlib
import http.client
import os
import pathlib
import re
import shutil
import stat
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO_ROOT not in sys.path:  # Run as a script: make tf_resnet importable.
    sys.path.insert(0, _REPO_ROOT)

from tf_resnet.config.datasets import DATASETS  # noqa: E402
from tf_resnet.config.families import WEIGHTS, WEIGHTS_DIR  # noqa: E402
from tf_resnet.errors import DataError  # noqa: E402

# The data root: `datasets/` of the checkout, wherever this is run from.
# The batch jobs (scripts/course_job.sh's DATA_ROOT) and the docs read it.
DATASETS_DIR = os.path.join(_REPO_ROOT, "datasets")


# Each dataset's published archives by --format, the first the default:
# the dataset table's (tf_resnet/config/datasets.py).
ARCHIVES = {name: facts.archives for name, facts in DATASETS.items()}


def default_weights_dir(name):
    """Where `--pretrained` finds a weights file without being told.

    Keras' file goes to `$KERAS_HOME/models/` (default `~/.keras/models/`),
    where `--pretrained=imagenet` looks for it, as Keras itself would put
    it; torchvision's goes to the checkout's `weights/`, for
    `--pretrained=PATH` (where the resnet18_cifar100 batch job looks).
    """
    if name == "keras_resnet50":
        home = os.environ.get("KERAS_HOME") or os.path.join("~", ".keras")
        return os.path.join(os.path.expanduser(home), "models")
    return os.path.join(_REPO_ROOT, WEIGHTS_DIR)


STAMP = ".download_complete"
_CHUNK = 1 << 20
_USER_AGENT = "tf-resnet-dataset-downloader"


def file_digest(path, algorithm="md5"):
    """Hex digest of a file (a checksum against corruption, not security)."""
    with open(path, "rb") as stream:
        digest = hashlib.file_digest(
            stream, lambda: hashlib.new(algorithm, usedforsecurity=False)
        )
    return digest.hexdigest()


def file_md5(path):
    """Hex md5 of a file."""
    return file_digest(path, "md5")


class _Progress:
    """One stderr line per 10% (per 20 MB if the size is unknown)."""

    def __init__(self, label, done, total):
        self.label, self.total = label, total
        self.step = max(total // 10, 1) if total else 20 * _CHUNK
        self.next = (done // self.step + 1) * self.step
        self.shown = None

    def update(self, done, final=False):
        if done < self.next and not (final and done != self.shown):
            return
        self.next = (done // self.step + 1) * self.step
        self.shown = done
        text = f"{self.label}: {done / 1e6:.1f} MB"
        if self.total:
            percent = 100 * done / self.total
            text += f" of {self.total / 1e6:.1f} MB ({percent:.0f}%)"
        print(text, file=sys.stderr, flush=True)


def _range_start(response):
    """First byte of a 206 answer, from `Content-Range: bytes N-M/T`."""
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _fetch_into(url, part):
    """Appends the missing bytes of `url` to `part`, or rewrites it whole.

    Raises `OSError` / `http.client.HTTPException` when the transfer breaks;
    the bytes received so far stay in `part` for the next attempt.
    """
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        if error.code == 416 and offset:
            error.close()  # Nothing left to send: md5 decides if it's whole.
            return
        raise
    with response:
        mode = "ab"
        if offset and response.status != 206:
            print(
                f"{url}: server ignored the resume request, starting over",
                file=sys.stderr,
            )
            offset, mode = 0, "wb"
        elif offset and _range_start(response) != offset:
            os.remove(part)
            raise ConnectionError(f"{url}: server sent the wrong byte range")
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length else None
        progress = _Progress(os.path.basename(url), offset, total)
        done = offset
        with open(part, mode) as stream:
            while chunk := response.read(_CHUNK):
                stream.write(chunk)
                done += len(chunk)
                progress.update(done)
        progress.update(done, final=True)
    if total is not None and done < total:
        raise ConnectionError(f"connection closed at byte {done} of {total}")


def download(url, path, md5, retries=3, retry_wait=5.0, algorithm="md5"):
    """Downloads `url` to `path` and checks its digest; resumes `path.part`.

    Args:
      url: where to get the file.
      path: final file; it exists only once its digest is verified.
      md5: expected hex digest of the whole file (md5 unless `algorithm`
        says otherwise), or a prefix of it (torchvision names its files by
        the first 8 hex digits of their sha256).
      retries: extra attempts after a broken connection or an HTTP 5xx.
      retry_wait: seconds between attempts.
      algorithm: a `hashlib` name.

    Returns:
      `path`.

    Raises:
      DataError: unreachable after all attempts (the `.part` file is kept
        for a later resume), HTTP 4xx, or digest mismatch (the file is
        deleted).
    """
    part = path + ".part"
    for attempt in range(retries + 1):
        try:
            _fetch_into(url, part)
            break
        except urllib.error.HTTPError as error:
            if error.code < 500 or attempt == retries:
                raise DataError(
                    f"{url}: HTTP {error.code} {error.reason}"
                ) from error
            reason = f"HTTP {error.code}"
        except (OSError, http.client.HTTPException) as error:
            if attempt == retries:
                kept = os.path.getsize(part) if os.path.exists(part) else 0
                hint = f"{kept} bytes kept in {part}, run again to resume"
                raise DataError(
                    f"{url}: download failed ({error}); "
                    + (hint if kept else "check the URL or the network")
                ) from error
            reason = str(error) or type(error).__name__
        print(
            f"{url}: {reason}; retrying in {retry_wait:g} s",
            file=sys.stderr,
        )
        time.sleep(retry_wait)
    actual = file_digest(part, algorithm)
    if not actual.startswith(md5):
        os.remove(part)
        raise DataError(
            f"{url}: {algorithm} of the download is {actual}, expected "
            f"{md5}{'' if len(md5) == len(actual) else '...'}; deleted "
            f"{part}. Run again, or use another --url."
        )
    os.replace(part, path)
    return path


def _check_member(archive, name, kind):
    """Refuses a member that could land outside the target or is special."""
    if kind not in ("file", "folder"):
        raise DataError(
            f"{archive}: refusing {kind} member {name!r}; dataset archives "
            "hold only files and folders"
        )
    parts = re.split(r"[/\\]", name)
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        raise DataError(f"{archive}: refusing absolute member path {name!r}")
    if ".." in parts:
        raise DataError(f"{archive}: refusing member path with '..': {name!r}")


def _tar_kind(member):
    if member.isfile():
        return "file"
    if member.isdir():
        return "folder"
    if member.issym():
        return f"symbolic link (-> {member.linkname!r})"
    if member.islnk():
        return f"hard link (-> {member.linkname!r})"
    if member.isfifo():
        return "FIFO"
    return "device" if member.isdev() else "unknown-type"


def _zip_kind(info):
    file_type = stat.S_IFMT(info.external_attr >> 16)
    if info.is_dir() or file_type == stat.S_IFDIR:
        return "folder"
    if file_type in (0, stat.S_IFREG):  # 0: written by a non-Unix tool.
        return "file"
    if file_type == stat.S_IFLNK:
        return "symbolic link"
    return "device or FIFO"


def _extract_tar(archive, staging):
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            _check_member(archive, member.name, _tar_kind(member))
        tar.extractall(staging, members=members, filter="data")


def _extract_zip(archive, staging):
    with zipfile.ZipFile(archive) as bundle:
        for info in bundle.infolist():
            _check_member(archive, info.filename, _zip_kind(info))
        bundle.extractall(staging)


def extract(archive, output_dir, folder, stamp_text):
    """Unpacks `folder/` of `archive` into `output_dir`, all or nothing.

    Returns:
      The path of the unpacked folder, which holds the stamp file.

    Raises:
      DataError: a hostile or unreadable archive, or one without `folder/`.
    """
    target = os.path.join(output_dir, folder)
    staging = tempfile.mkdtemp(
        prefix=f".{folder}.", suffix=".partial", dir=output_dir
    )
    try:
        if archive.endswith(".zip"):
            _extract_zip(archive, staging)
        else:
            _extract_tar(archive, staging)
        unpacked = os.path.join(staging, folder)
        if not os.path.isdir(unpacked):
            raise DataError(f"{archive}: no top-level folder {folder}/ inside")
        with open(os.path.join(unpacked, STAMP), "w") as stream:
            stream.write(stamp_text)
        os.rename(unpacked, target)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise DataError(f"{archive}: cannot unpack: {e}") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _is_complete(target, stamp_text):
    stamp = os.path.join(target, STAMP)
    return os.path.isfile(stamp) and pathlib.Path(stamp).read_text() == (
        stamp_text
    )


def prepare(
    dataset,
    output_dir,
    fmt=None,
    url=None,
    keep_archive=False,
    retries=3,
    retry_wait=5.0,
):
    """Makes `output_dir/<folder>` hold the verified dataset; returns it.

    Does nothing if a previous run already unpacked the same archive.

    Args:
      dataset: `cifar10`, `cifar100` or `tinyimagenet`.
      output_dir: where the archive and its folder go.
      fmt: archive format (`binary`/`python` for CIFAR, `jpeg`); default
        the first one of `ARCHIVES[dataset]`.
      url: a mirror of the same file (its md5 must match the official one).
      keep_archive: keep the verified archive after unpacking it.
      retries: see `download`.
      retry_wait: see `download`.
    """
    if dataset not in ARCHIVES:
        raise DataError(
            f"unknown dataset {dataset!r}; known: {', '.join(ARCHIVES)}"
        )
    formats = ARCHIVES[dataset]
    fmt = fmt or next(iter(formats))
    if fmt not in formats:
        raise DataError(f"{dataset} comes as {', '.join(formats)}, not {fmt}")
    spec = formats[fmt]
    os.makedirs(output_dir, exist_ok=True)
    target = os.path.join(output_dir, spec.folder)
    stamp_text = f"{spec.filename} md5={spec.md5}\n"
    if _is_complete(target, stamp_text):
        print(f"{target}: already downloaded and verified", file=sys.stderr)
        return target
    if os.path.exists(target):
        raise DataError(
            f"{target} exists but was not unpacked by this tool from "
            f"{spec.filename}; move it away and run again"
        )
    leftovers = os.path.join(output_dir, f".{spec.folder}.*.partial")
    for stale in glob.glob(leftovers):  # Left by a crashed run.
        shutil.rmtree(stale, ignore_errors=True)
    archive = os.path.join(output_dir, spec.filename)
    if os.path.exists(archive) and file_md5(archive) != spec.md5:
        os.remove(archive)  # Not written by us: we only rename verified files.
    if not os.path.exists(archive):
        download(url or spec.url, archive, spec.md5, retries, retry_wait)
    extract(archive, output_dir, spec.folder, stamp_text)
    if not keep_archive:
        os.remove(archive)
    return target


def prepare_weights(name, output_dir=None, url=None, retries=3, retry_wait=5.0):
    """Makes `output_dir/<official file name>` the verified weights file.

    Does nothing if the file is already there and verified; a file of that
    name with another digest is not ours to delete, so it is an error.

    Args:
      name: a key of `WEIGHTS`.
      output_dir: default `default_weights_dir(name)`.
      url: a mirror of the same file (its digest must match).
      retries: see `download`.
      retry_wait: see `download`.

    Returns:
      The path of the weights file.
    """
    if name not in WEIGHTS:
        raise DataError(
            f"unknown weights {name!r}; known: {', '.join(WEIGHTS)}"
        )
    spec = WEIGHTS[name]
    output_dir = output_dir or default_weights_dir(name)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, spec.filename)
    if os.path.exists(path):
        actual = file_digest(path, spec.algorithm)
        if not actual.startswith(spec.digest):
            raise DataError(
                f"{path} exists but its {spec.algorithm} is {actual}, not "
                f"{spec.digest}...; move it away and run again"
            )
        print(f"{path}: already downloaded and verified", file=sys.stderr)
        return path
    return download(
        url or spec.url,
        path,
        spec.digest,
        retries,
        retry_wait,
        algorithm=spec.algorithm,
    )


def main(argv=None):
    """Command line: one dataset or weights file; errors in one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--dataset", choices=sorted(ARCHIVES))
    what.add_argument("--weights", choices=sorted(WEIGHTS))
    parser.add_argument(
        "--output_dir",
        help="default: the checkout's datasets/ (--dataset), where the "
        "batch jobs read; weights/ or Keras' folder (--weights)",
    )
    parser.add_argument(
        "--format", help="binary (default) or python for CIFAR; jpeg"
    )
    parser.add_argument("--url", help="mirror of the official file")
    parser.add_argument("--keep_archive", action="store_true")
    parser.add_argument("--retries", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        if args.weights:
            target = prepare_weights(
                args.weights, args.output_dir, args.url, args.retries
            )
        else:
            target = prepare(
                args.dataset,
                args.output_dir or DATASETS_DIR,
                fmt=args.format,
                url=args.url,
                keep_archive=args.keep_archive,
                retries=args.retries,
            )
    except DataError as error:
        parser.exit(1, f"error: {error}\n")
    print(target)


if __name__ == "__main__":
    main()
