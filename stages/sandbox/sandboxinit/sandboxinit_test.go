package sandboxinit

import (
	"os"
	"slices"
	"testing"
)

func TestCappedBuffer(t *testing.T) {
	tests := []struct {
		limit     int
		writes    []string
		kept      string
		total     int64
		truncated bool
	}{
		{5, []string{"ab", "cd"}, "abcd", 4, false},
		{5, []string{"abc", "def"}, "abcde", 6, true},
		{5, []string{"abcde"}, "abcde", 5, false},
		{0, []string{"x"}, "", 1, true},
	}
	for _, tc := range tests {
		b := NewCappedBuffer(tc.limit)
		for _, w := range tc.writes {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("write %q: %d %v", w, n, err)
			}
		}
		if string(b.Bytes()) != tc.kept || b.Total() != tc.total || b.Truncated() != tc.truncated {
			t.Errorf("%+v: kept %q total %d truncated %v", tc, b.Bytes(), b.Total(), b.Truncated())
		}
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"PATH=/bin", "HOME=/root"}, []string{"HOME=/home/a", "X=1", "PATH=/p"})
	if want := []string{"PATH=/p", "HOME=/home/a", "X=1"}; !slices.Equal(got, want) {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestSessionOf(t *testing.T) {
	sid, pgid, ok := sessionOf(os.Getpid())
	if !ok || sid <= 0 || pgid <= 0 {
		t.Fatalf("own session: %d %d %v", sid, pgid, ok)
	}
	if _, _, ok := sessionOf(1 << 30); ok {
		t.Fatal("session of a missing pid")
	}
}
