package shellagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// BinaryName is the agent's executable (built from cmd/kiln-agent).
const BinaryName = "kiln-agent"

// FindBinary returns the kiln-agent binary to put into a sandbox: configured
// when it is not "", else the one beside the running executable (make build
// puts every kiln binary in bin/), else the one on PATH — the order in which
// the bwrap provider finds kiln-sandbox-helper.
func FindBinary(configured string) (string, error) {
	if configured != "" {
		st, err := os.Stat(configured)
		if err != nil {
			return "", fmt.Errorf("%s %s: %w", BinaryName, configured, err)
		}
		if st.IsDir() {
			return "", fmt.Errorf("%s %s: is a directory", BinaryName, configured)
		}
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), BinaryName)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s beside %s: %w", BinaryName, exe, err)
		}
	}
	if p, err := exec.LookPath(BinaryName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found beside the executable or on PATH; build it (go build -o bin/ ./cmd/%s, or make build)", BinaryName, BinaryName)
}
