package sandbox

import (
	"encoding/binary"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The sandbox's seccomp filter. Without a user namespace the sandbox's root
// is the host's uid 0 (with Docker's capabilities less MKNOD and NET_RAW, and
// no_new_privs), so what stands between graded code and the host kernel is
// those capabilities and the kernel's own checks. The filter trims the
// kernel surface the way Docker's default profile does for a container
// without CAP_SYS_ADMIN: the kernel keyring (host root's _uid.0 keyring is
// otherwise shared), namespace creation and entry (an unprivileged user
// namespace hands back every capability inside it), mounts, module and kexec
// loading, BPF, perf events, userfaultfd, handle-based opens, and io_uring.
// A denied call fails with EPERM (ENOSYS for clone3 and io_uring, so libc
// and libuv fall back to what is allowed); any other architecture's calls
// kill the process.
//
// clone3 passes its flags in memory, where a filter cannot read them, so it
// is denied outright — except when the sandbox's cgroup is v2: there init
// starts every command with clone3(CLONE_INTO_CGROUP), so clone3 stays
// allowed, and only that route to a new namespace stays open (unshare,
// setns and clone with namespace flags are still refused).

// seccompFilter returns the compiled filter (struct sock_filter array, host
// byte order) for bwrap --seccomp, or nil where kiln has no syscall table for
// the architecture.
func seccompFilter(allowClone3 bool) []byte {
	tab := seccompArch()
	if tab == nil {
		return nil
	}
	var p bpfProgram
	p.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompDataArch)
	p.jumpIfNot(tab.arch, "kill")
	p.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompDataNr)
	if tab.x32Bit != 0 {
		// x32 system calls on x86_64 carry this bit: none is allowed.
		p.jumpIfGE(tab.x32Bit, "eperm")
	}
	for _, nr := range tab.denied {
		p.jumpIf(nr, "eperm")
	}
	for _, nr := range tab.enosys {
		p.jumpIf(nr, "enosys")
	}
	if !allowClone3 {
		p.jumpIf(unix.SYS_CLONE3, "enosys")
	}
	p.jumpIf(unix.SYS_CLONE, "clone")
	p.ret(unix.SECCOMP_RET_ALLOW)

	// clone: refuse the namespace flags (all in the low 32 bits of the first
	// argument; seccomp_data.args[0] is little-endian on both tables here).
	p.label("clone")
	p.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, seccompDataArgs)
	p.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, namespaceFlags)
	p.jumpIf(0, "allow")
	p.ret(unix.SECCOMP_RET_ERRNO | uint32(syscall.EPERM))
	p.label("allow")
	p.ret(unix.SECCOMP_RET_ALLOW)
	p.label("eperm")
	p.ret(unix.SECCOMP_RET_ERRNO | uint32(syscall.EPERM))
	p.label("enosys")
	p.ret(unix.SECCOMP_RET_ERRNO | uint32(syscall.ENOSYS))
	p.label("kill")
	p.ret(unix.SECCOMP_RET_KILL_PROCESS)
	return p.assemble()
}

// bytesFile returns a pipe's read end that yields b and then EOF, for a
// child to read (the filter is far below a pipe's buffer).
func bytesFile(b []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = w.Write(b)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Offsets into struct seccomp_data.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	seccompDataArgs = 16
)

const namespaceFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// syscallTable is one architecture's part of the filter.
type syscallTable struct {
	arch   uint32
	x32Bit uint32   // a bit that marks a foreign ABI's calls (0: none)
	denied []uint32 // EPERM
	enosys []uint32 // ENOSYS: callers fall back
}

// deniedCommon are the calls both tables refuse with EPERM, by their
// architecture-independent names (x/sys/unix resolves each per GOARCH).
func deniedCommon() []uint32 {
	return []uint32{
		unix.SYS_ADD_KEY, unix.SYS_KEYCTL, unix.SYS_REQUEST_KEY,
		unix.SYS_UNSHARE, unix.SYS_SETNS,
		unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT,
		unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
		unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
		unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_REBOOT,
		unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
		unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
		unix.SYS_ACCT, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_SYSLOG, unix.SYS_QUOTACTL,
		unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
		unix.SYS_LOOKUP_DCOOKIE, unix.SYS_PIDFD_GETFD, unix.SYS_PROCESS_VM_WRITEV,
	}
}

func enosysCommon() []uint32 {
	return []uint32{unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER}
}

// bpfProgram assembles a classic BPF program with forward jumps to labels.
type bpfProgram struct {
	ins    []unix.SockFilter
	fixups []bpfFixup
	labels map[string]int
}

type bpfFixup struct {
	at    int
	label string
	onT   bool // the label is the true branch (else the false branch)
}

func (p *bpfProgram) stmt(code uint16, k uint32) {
	p.ins = append(p.ins, unix.SockFilter{Code: code, K: k})
}

func (p *bpfProgram) ret(k uint32) { p.stmt(unix.BPF_RET|unix.BPF_K, k) }

func (p *bpfProgram) jump(code uint16, k uint32, label string, onT bool) {
	p.fixups = append(p.fixups, bpfFixup{at: len(p.ins), label: label, onT: onT})
	p.ins = append(p.ins, unix.SockFilter{Code: code, K: k})
}

// jumpIf goes to label when A == k, else on.
func (p *bpfProgram) jumpIf(k uint32, label string) {
	p.jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, label, true)
}

// jumpIfNot goes to label when A != k, else on.
func (p *bpfProgram) jumpIfNot(k uint32, label string) {
	p.jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, label, false)
}

// jumpIfGE goes to label when A >= k, else on.
func (p *bpfProgram) jumpIfGE(k uint32, label string) {
	p.jump(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, k, label, true)
}

func (p *bpfProgram) label(name string) {
	if p.labels == nil {
		p.labels = map[string]int{}
	}
	p.labels[name] = len(p.ins)
}

// assemble resolves the jumps and encodes the program. Jump offsets are 8
// bits; the filter is far shorter than that, and a longer one is a
// programming error.
func (p *bpfProgram) assemble() []byte {
	for _, f := range p.fixups {
		to, ok := p.labels[f.label]
		off := to - f.at - 1
		if !ok || off < 0 || off > 255 {
			panic(fmt.Sprintf("sandbox: seccomp filter: bad jump to %q from %d", f.label, f.at))
		}
		if f.onT {
			p.ins[f.at].Jt = uint8(off)
		} else {
			p.ins[f.at].Jf = uint8(off)
		}
	}
	out := make([]byte, 0, 8*len(p.ins))
	for _, in := range p.ins {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out
}
