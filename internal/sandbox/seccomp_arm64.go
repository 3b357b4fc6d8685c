package sandbox

import "golang.org/x/sys/unix"

func seccompArch() *syscallTable {
	return &syscallTable{arch: unix.AUDIT_ARCH_AARCH64, denied: deniedCommon(), enosys: enosysCommon()}
}
