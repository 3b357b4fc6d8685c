package sandbox

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// The filter assembles (every jump resolved within 8 bits) and refuses
// clone3 unless v2 cgroups need it; its behaviour inside a sandbox is
// TestIsolation's.
func TestSeccompFilter(t *testing.T) {
	if seccompArch() == nil {
		t.Skip("no syscall table for this architecture")
	}
	for _, allowClone3 := range []bool{false, true} {
		prog := seccompFilter(allowClone3)
		if len(prog) == 0 || len(prog)%8 != 0 {
			t.Fatalf("filter of %d bytes", len(prog))
		}
		clone3 := false
		for i := 0; i < len(prog); i += 8 {
			code, k := binary.NativeEndian.Uint16(prog[i:]), binary.NativeEndian.Uint32(prog[i+4:])
			if code == unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K && k == unix.SYS_CLONE3 {
				clone3 = true
			}
		}
		if clone3 == allowClone3 {
			t.Errorf("allowClone3=%v: clone3 tested %v", allowClone3, clone3)
		}
	}
}
