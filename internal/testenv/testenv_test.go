package testenv

import (
	"fmt"
	"os"
	"testing"
)

// recorder stands in for a testing.TB: it records how the test would have
// stopped. The real Skip and Fatal end the goroutine; recorder panics with
// stopped instead, so that nothing after them runs.
type recorder struct {
	testing.TB
	how, msg string
}

type stopped struct{}

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.stop("skip", args) }
func (r *recorder) Fatal(args ...any) { r.stop("fatal", args) }
func (r *recorder) stop(how string, args []any) {
	r.how, r.msg = how, fmt.Sprint(args...)
	panic(stopped{})
}

func run(format string, args ...any) (r *recorder) {
	r = &recorder{}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stopped); !ok {
				panic(p)
			}
		}
	}()
	SkipOrFail(r, format, args...)
	r.how = "returned"
	return r
}

func TestSkipOrFail(t *testing.T) {
	for _, tc := range []struct {
		ci, how, msg string
	}{
		{"unset", "skip", "bwrap is not installed"},
		{"", "skip", "bwrap is not installed"},
		{"false", "skip", "bwrap is not installed"},
		{"1", "skip", "bwrap is not installed"},
		{"true", "fatal", "bwrap is not installed (CI=true: required)"},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci) // restored after the test, also when unset below
			if tc.ci == "unset" {
				os.Unsetenv("CI")
			}
			r := run("%s is not installed", "bwrap")
			if r.how != tc.how || r.msg != tc.msg {
				t.Errorf("SkipOrFail under CI=%q: %s %q, want %s %q", tc.ci, r.how, r.msg, tc.how, tc.msg)
			}
		})
	}
}
