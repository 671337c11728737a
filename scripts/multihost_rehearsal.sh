#!/usr/bin/env bash
# A two-host Horovod launch rehearsed on one machine (docs/launcher.md): sshd listens on
# the loopback addresses 127.0.0.2 and 127.0.0.3, which stand for two hosts, and
#   horovodrun -np 4 -H 127.0.0.2:2,127.0.0.3:2 --gloo
# starts two ranks on each over ssh, as a user with two hosts would launch them. The arguments
# after the script's name go to launch.train (default: a short row-sharded DeepFM run).
#
# Needs sshd (Debian/Ubuntu: apt-get install openssh-server) and the project's .venv (make
# setup). What it makes (a user key, sshd's configuration and log, the run's checkpoints) lives
# in a temporary directory removed at the end, when sshd stops; the host key is kept in
# ~/.cache/tfscale, and ssh adds the two addresses to ~/.ssh/known_hosts (Horovod's ssh
# commands set StrictHostKeyChecking=no). It runs as the current user. CI does not run it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SSH_PORT=${SSH_PORT:-2222}
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
if [ ! -x "$SSHD" ]; then
  echo "multihost_rehearsal.sh: sshd not found; install it (apt-get install openssh-server)" >&2
  exit 1
fi
if [ ! -x "$PY" ]; then
  echo "multihost_rehearsal.sh: $PY not found; run make setup first" >&2
  exit 1
fi
WORK=$(mktemp -d /tmp/tfscale-multihost.XXXXXX)
if [ $# -eq 0 ]; then
  set -- --embedding_sharding=row --optimizer=cowclip --train_rows=40000 --test_rows=8000 \
    --synthetic_vocabulary_scale=0.01 --batch_size=2048 --epochs=1 --logdir=none \
    --checkpoint_dir="$WORK/checkpoints"
fi
stop_sshd() {
  if [ -f "$WORK/sshd.pid" ]; then kill "$(cat "$WORK/sshd.pid")" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap stop_sshd EXIT

# One host key kept across rehearsals, so that the addresses' entries in known_hosts stay valid.
HOST_KEY=${XDG_CACHE_HOME:-$HOME/.cache}/tfscale/multihost_host_key
if [ ! -f "$HOST_KEY" ]; then
  mkdir -p "$(dirname "$HOST_KEY")"
  ssh-keygen -q -t ed25519 -N '' -f "$HOST_KEY"
fi
ssh-keygen -q -t ed25519 -N '' -f "$WORK/user_key"
cp "$WORK/user_key.pub" "$WORK/authorized_keys"
cat > "$WORK/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.2
ListenAddress 127.0.0.3
HostKey $HOST_KEY
AuthorizedKeysFile $WORK/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile $WORK/sshd.pid
EOF
mkdir -p /run/sshd 2>/dev/null || true  # sshd's privilege-separation directory
"$SSHD" -f "$WORK/sshd_config" -E "$WORK/sshd.log"
for _ in $(seq 50); do [ -s "$WORK/sshd.pid" ] && break; sleep 0.1; done
for host in 127.0.0.2 127.0.0.3; do
  ssh -p "$SSH_PORT" -i "$WORK/user_key" -o BatchMode=yes -o StrictHostKeyChecking=no \
    "$host" hostname > /dev/null || { cat "$WORK/sshd.log" >&2; exit 1; }
done
echo "sshd on 127.0.0.2:$SSH_PORT and 127.0.0.3:$SSH_PORT; launching 4 ranks over ssh"

HOROVODRUN=("$(dirname "$PY")/horovodrun" -np 4 -H 127.0.0.2:2,127.0.0.3:2 --gloo
  --ssh-port "$SSH_PORT" --ssh-identity-file "$WORK/user_key" --network-interfaces lo)
# Where each rank runs: its host as Horovod assigned it and the ssh connection it came by.
"${HOROVODRUN[@]}" "$PWD/$PY" -c 'import os; print("rank", os.environ["HOROVOD_RANK"], "on",
  os.environ["HOROVOD_HOSTNAME"], "over ssh", os.environ.get("SSH_CONNECTION", "(none)"))'
set -x
"${HOROVODRUN[@]}" "$PWD/$PY" -m launch.train "$@"
{ set +x; } 2> /dev/null
