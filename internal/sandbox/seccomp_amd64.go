package sandbox

import "golang.org/x/sys/unix"

func seccompArch() *syscallTable {
	return &syscallTable{
		arch:   unix.AUDIT_ARCH_X86_64,
		x32Bit: 0x40000000, // __X32_SYSCALL_BIT
		denied: append(deniedCommon(), unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_USELIB, unix.SYS__SYSCTL,
			unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS, unix.SYS_QUERY_MODULE, unix.SYS_NFSSERVCTL, unix.SYS_USTAT, unix.SYS_SYSFS),
		enosys: enosysCommon(),
	}
}
