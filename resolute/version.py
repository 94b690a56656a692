"""The installed distribution's version, as the agent reports it to the master.

`master.version` computes the same value on its own: the agent must not import the master
package, and `det` should not pay for importing the training library at start-up."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("resolute")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0"
