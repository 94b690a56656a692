"""The resolute agent."""

import os

# The agent spawns ranks while gRPC's threads run; gRPC's fork handlers only add noise
# ("skipping fork() handlers") and risk, since ranks are started with exec, never bare fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
# gRPC core's own INFO lines (one per failed TLS handshake, say) would repeat what the link
# already logs in one line of its own; errors still show.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
