from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("resolute")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"

# The Determined release whose official client we are wire-compatible with.
DETERMINED_COMPAT_VERSION = "0.38.1"
