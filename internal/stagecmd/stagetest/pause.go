package stagetest

import (
	"fmt"
	"os"
	"time"
)

// PauseHook is the writer hook of a test binary that doubles as a stage
// for crash tests (KILN_TEST_HELPER=1): at the hook point named by
// KILN_TEST_PAUSE_AT it prints "PAUSED <point>" on stderr and waits, for
// the test's SIGKILL, or until the file KILN_TEST_RESUME_FILE appears.
// Any other point returns at once.
func PauseHook(point string) {
	if point != os.Getenv("KILN_TEST_PAUSE_AT") {
		return
	}
	fmt.Fprintf(os.Stderr, "PAUSED %s\n", point)
	resume := os.Getenv("KILN_TEST_RESUME_FILE")
	for {
		if resume != "" {
			if _, err := os.Stat(resume); err == nil {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}
