#!/usr/bin/env bash
# Boots a private systemd for tests that start a real service under it:
#
#   unshare --pid --fork --mount --uts --ipc --propagation private \
#       tests/systemd/boot.sh CONSOLE_LOG
#
# It runs as PID 1 of the new namespaces and starts nothing of the host's:
# every unit a boot target would pull is masked (journald alone is kept, so
# `journalctl` works), and every folder systemd or a unit writes to
# (/run, /var/cache, /var/log, /var/tmp, /var/lib/systemd,
# /etc/systemd/system) is a private tmpfs. The host's /tmp is never cleaned:
# systemd-tmpfiles is masked. systemd's own log goes to CONSOLE_LOG.
# Enter it with `nsenter -t PID -m -u -i -p` (PID: this process seen from
# outside); kill it with SIGKILL, which ends everything inside.
set -euo pipefail
if [ "$$" != 1 ]; then
    echo "boot.sh: run it as PID 1 of a new PID namespace (unshare --pid --fork ...)" >&2
    exit 2
fi
console=${1:?boot.sh: give the file for systemd\'s console log}
mount -t proc proc /proc
for d in /run /var/cache /var/log /var/tmp /var/lib/systemd /etc/systemd/system; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=755 tmpfs "$d"
done
touch "$console"
mount --bind "$console" /dev/console
mkdir -p /run/systemd/system
mask() { ln -sf /dev/null "/run/systemd/system/$1"; }
keep=" systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket "
for wanted in /lib/systemd/system/*.wants/* /usr/lib/systemd/system/*.wants/*; do
    name=${wanted##*/}
    case "$keep" in
        *" $name "*) ;;
        *) mask "$name" ;;
    esac
done
for name in tmp.mount systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-setup-dev-early.service systemd-tmpfiles-clean.service \
    systemd-tmpfiles-clean.timer systemd-remount-fs.service systemd-journald-audit.socket \
    systemd-udevd.service systemd-udev-trigger.service systemd-sysctl.service \
    systemd-networkd.service systemd-resolved.service systemd-logind.service \
    getty.target console-getty.service dbus.service dbus.socket; do
    mask "$name"
done
cat > /run/systemd/system/minions-test.target <<'UNIT'
[Unit]
Description=A private systemd for tests: it starts only what is asked
DefaultDependencies=no
UNIT
exec /lib/systemd/systemd --system --unit=minions-test.target --log-target=console --show-status=no
