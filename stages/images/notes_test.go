package images_test

import (
	"archive/tar"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/stages/images"
)

// TestNotesSummarised: an image's notes are one log line, a count by kind
// naming the image.json that lists every note, not a line per note.
func TestNotesSummarised(t *testing.T) {
	layer := []ent{dir("dev", 0o755, 0, 0)}
	for _, n := range []string{"dev/null", "dev/zero", "dev/tty"} {
		layer = append(layer, ent{name: n, typ: tar.TypeChar, mode: 0o666})
	}
	layer = append(layer, file("etc/hostname", "kiln\n", 0o644, 0, 0))
	layoutDir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, layoutDir, map[string]v1.Image{"dev": buildImage(t, imageConfig{env: []string{"PATH=/bin"}}, layerTar(t, layer))})
	store, root := t.TempDir(), t.TempDir()
	tasks := importTasks(t, store, tasksRow("t1", testRepo+":dev", "/testbed"))
	r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--root", root, "--source", testRepo+"=oci:"+layoutDir)
	require.Equal(t, 0, r.Code, r.Stderr)

	matches, _ := filepath.Glob(filepath.Join(root, "sha256", "*", "image.json"))
	require.Len(t, matches, 1)
	var notes []string
	for _, l := range strings.Split(r.Stderr, "\n") {
		if strings.Contains(l, "msg=note") {
			notes = append(notes, l)
		}
	}
	require.Len(t, notes, 1, r.Stderr)
	assert.Contains(t, notes[0], `msg=notes image=`+testRepo+`:dev summary="3 device nodes skipped" list=`+matches[0])

	var info images.ImageJSON
	b, err := os.ReadFile(matches[0])
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &info))
	assert.Equal(t, []string{`skipped device node "dev/null"`, `skipped device node "dev/zero"`, `skipped device node "dev/tty"`}, info.Notes)
}
