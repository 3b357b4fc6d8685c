package images_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/testenv"
)

// duLine is one parsed line of kiln-images du.
type duLine struct {
	kind, name string
	bytes      int64
	fields     map[string]int64
}

func parseDU(t *testing.T, out string) []duLine {
	t.Helper()
	var lines []duLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		parts := strings.Split(l, "\t")
		d := duLine{kind: parts[0], fields: map[string]int64{}}
		rest := parts[1:]
		if d.kind != "total" {
			d.name, rest = rest[0], rest[1:]
		}
		if d.kind == "layer" {
			n, err := strconv.ParseInt(rest[0], 10, 64)
			require.NoError(t, err, l)
			d.bytes, rest = n, rest[1:]
		}
		for _, f := range strings.Fields(strings.Join(rest, " ")) {
			k, v, ok := strings.Cut(f, "=")
			require.True(t, ok, l)
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, l)
			d.fields[k] = n
		}
		lines = append(lines, d)
	}
	return lines
}

// TestDU: two images datasets whose three images share one base layer.
// du lists each layer once with the bundles that list it (the base: 3),
// and per dataset the bytes of its layers split into unique (its own top
// layers) and shared (the base); the total counts the base once, below
// the images' unpacked bytes. Without --images the node is one group.
func TestDU(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "the layered form needs root")
	}
	layoutDir := filepath.Join(t.TempDir(), "layout")
	big := func(name string, kb int) ent { return file(name, strings.Repeat("x", kb<<10), 0o644, 0, 0) }
	base := layerTar(t, []ent{dir("usr", 0o755, 0, 0), big("usr/base", 256)})
	writeLayout(t, layoutDir, map[string]v1.Image{
		"a1": buildImage(t, imageConfig{}, base, layerTar(t, []ent{big("a1", 16)})),
		"a2": buildImage(t, imageConfig{}, base, layerTar(t, []ent{big("a2", 32)})),
		"c":  buildImage(t, imageConfig{}, base, layerTar(t, []ent{big("c", 64)})),
	})
	store, root := t.TempDir(), t.TempDir()
	importAs := func(out string, rows ...string) string {
		tasks := importTasks(t, store, rows...)
		r := kiln(t, "images", "import", "--store", store, "--tasks", tasks, "--bundles", root, "--source", testRepo+"=oci:"+layoutDir, "--out", out)
		require.Equal(t, 0, r.Code, r.Stderr)
		return r.LastLine()
	}
	one := importAs("images/one", tasksRow("t1", testRepo+":a1", "/"), tasksRow("t2", testRepo+":a2", "/"))
	two := importAs("images/two", tasksRow("t3", testRepo+":c", "/"))

	r := kiln(t, "images", "du", "--store", store, "--bundles", root, "--images", one, "--images", two)
	require.Equal(t, 0, r.Code, r.Stderr)
	lines := parseDU(t, r.Stdout)
	var layers []duLine
	datasets := map[string]duLine{}
	var total duLine
	for _, l := range lines {
		switch l.kind {
		case "layer":
			layers = append(layers, l)
		case "dataset":
			datasets[l.name] = l
		case "total":
			total = l
		}
	}
	require.Len(t, layers, 4, r.Stdout)
	var baseBytes, sum int64
	tops := map[int64]bool{}
	for _, l := range layers {
		assert.True(t, strings.HasPrefix(l.name, "layers/sha256/"), l.name)
		assert.Positive(t, l.bytes, l.name)
		sum += l.bytes
		if l.fields["bundles"] == 3 {
			baseBytes = l.bytes
		} else {
			assert.Equal(t, int64(1), l.fields["bundles"], l.name)
			tops[l.bytes] = true
		}
	}
	require.Positive(t, baseBytes, "the base layer is listed by all 3 bundles:\n%s", r.Stdout)
	assert.Greater(t, baseBytes, int64(256<<10))
	d1, d2 := datasets[one], datasets[two]
	assert.Equal(t, map[string]int64{"bundles": 2, "layers": 3, "bytes": d1.fields["bytes"], "unique": d1.fields["bytes"] - baseBytes, "shared": baseBytes}, d1.fields, r.Stdout)
	assert.Equal(t, map[string]int64{"bundles": 1, "layers": 2, "bytes": d2.fields["bytes"], "unique": d2.fields["bytes"] - baseBytes, "shared": baseBytes}, d2.fields, r.Stdout)
	assert.Equal(t, sum, d1.fields["bytes"]+d2.fields["bytes"]-baseBytes, "the base counted once between the two")
	assert.Equal(t, int64(4), total.fields["layers"])
	assert.Equal(t, sum, total.fields["bytes"])
	assert.Greater(t, total.fields["images_bytes"], total.fields["bytes"], "sharing the base saves its bytes twice over")
	assert.Equal(t, r.Stdout, kiln(t, "images", "du", "--store", store, "--bundles", root, "--images", one, "--images", two).Stdout, "du only reads")

	// One group, the node: every layer, none shared with another group.
	r = kiln(t, "images", "du", "--bundles", root)
	require.Equal(t, 0, r.Code, r.Stderr)
	for _, l := range parseDU(t, r.Stdout) {
		if l.kind == "dataset" {
			assert.Equal(t, "node", l.name)
			assert.Equal(t, map[string]int64{"bundles": 3, "layers": 4, "bytes": sum, "unique": sum, "shared": 0}, l.fields)
		}
	}
}
