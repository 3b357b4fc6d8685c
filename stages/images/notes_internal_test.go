package images

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSummarizeNotes(t *testing.T) {
	cases := []struct {
		counts map[noteKind]int
		want   string
	}{
		{nil, ""},
		{map[noteKind]int{noteDeviceNode: 1}, "1 device node skipped"},
		{map[noteKind]int{noteDeviceNode: 16}, "16 device nodes skipped"},
		{map[noteKind]int{noteXattr: 2, noteDeviceNode: 16}, "16 device nodes skipped, 2 xattrs not applied"},
		{map[noteKind]int{noteXattr: 1, noteDeviceNode: 0}, "1 xattr not applied"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, summarizeNotes(c.counts), "%v", c.counts)
	}
}
