#!/usr/bin/env bash
# Makes sure a PostgreSQL server answers on 127.0.0.1:5432 for user postgres with trust auth.
# On the project's machines one already runs; on a bare Debian machine (as root) this installs
# and starts one, so the Postgres half of the suite never skips in CI.
set -euo pipefail

ready() { command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; }

if ready; then
  echo "postgres: a server answers on 127.0.0.1:5432"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "postgres: none on 127.0.0.1:5432 and not root; the Postgres tests will skip (fail under CI=true)"
  exit 0
fi
echo "postgres: installing and starting a local server"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
version=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$version/main/pg_hba.conf
sed -i -E 's/^(local|host)(\s+all\s+all\s+.*)\s(peer|scram-sha-256|md5)$/\1\2 trust/' "$hba"
sed -i -E 's/^(local\s+all\s+postgres\s+)peer$/\1trust/' "$hba"
pg_ctlcluster "$version" main start || pg_ctlcluster "$version" main restart
for _ in $(seq 1 30); do ready && break; sleep 1; done
ready || { echo "postgres: the server did not start"; exit 1; }
