package sync

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kilnrl/kiln/internal/modeldir"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// indexFile is the shard index of a sharded safetensors checkpoint; a lone
// loneShard needs none (docs/sync.md §1).
const (
	indexFile = "model.safetensors.index.json"
	loneShard = "model.safetensors"
)

// ckptFile is one file of a checkpoint that an engine loads.
type ckptFile struct {
	Rel  string // path in the directory, slash separated
	Path string // on disk
	Size int64
	// Shard is the checked header of a safetensors file; nil otherwise.
	Shard *stHeader
}

// checkpoint is a checked model directory: the files an engine loads,
// sorted by path.
type checkpoint struct {
	Dir   string
	Files []ckptFile
}

// scanCheckpoint lists and checks what an engine loads from dir (docs/sync.md
// §1): the safetensors shards and their index (or a lone model.safetensors),
// and every other top-level regular file that is neither weights in another
// format nor a trainer file. Every shard header is checked
// (readSafetensorsHeader); the index must name every shard present and
// every tensor of each shard exactly once, in the shard that holds it. A
// missing index or shard, a tensor the index places elsewhere, or a shard
// the index does not name is bad input (exit 5) naming the file.
func scanCheckpoint(dir string) (*checkpoint, error) {
	bad := func(format string, args ...any) error {
		return stagecmd.BadInputf("checkpoint %q: %s", dir, fmt.Sprintf(format, args...))
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %q: %w", dir, err)
	}
	c := &checkpoint{Dir: dir}
	var shards []string
	hasIndex := false
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		switch {
		case strings.HasSuffix(name, ".safetensors"):
			shards = append(shards, name)
		case name == indexFile:
			hasIndex = true
		case modeldir.IsWeightFile(name) || modeldir.IsTrainerFile(name):
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, fmt.Errorf("checkpoint %q: %w", dir, err)
		}
		c.Files = append(c.Files, ckptFile{Rel: name, Path: filepath.Join(dir, name), Size: fi.Size()})
	}
	sort.Slice(c.Files, func(i, j int) bool { return c.Files[i].Rel < c.Files[j].Rel })
	headers := map[string]*stHeader{}
	for i := range c.Files {
		f := &c.Files[i]
		if !strings.HasSuffix(f.Rel, ".safetensors") {
			continue
		}
		h, err := readHeaderFile(f.Path, f.Size, f.Rel)
		if err != nil {
			return nil, err
		}
		f.Shard = h
		headers[f.Rel] = h
	}
	switch {
	case !hasIndex && len(shards) == 1 && shards[0] == loneShard:
		return c, nil
	case !hasIndex && len(shards) == 0:
		return nil, bad("no safetensors weights (want %s with its shards, or a lone %s)", indexFile, loneShard)
	case !hasIndex:
		return nil, bad("%d safetensors files (%s) but no %s: the index is missing; copy it from where the checkpoint was saved",
			len(shards), strings.Join(shards, ", "), indexFile)
	}
	data, err := os.ReadFile(filepath.Join(dir, indexFile))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %q: %w", dir, err)
	}
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil || len(idx.WeightMap) == 0 {
		return nil, bad("%s has no weight_map (%v)", indexFile, err)
	}
	named := map[string]bool{}
	for tensor, shard := range idx.WeightMap {
		h := headers[shard]
		if h == nil {
			return nil, bad("%s places tensor %q in %q, which is missing: the shard is missing; copy it in or re-save the checkpoint", indexFile, tensor, shard)
		}
		named[shard] = true
		if !h.has(tensor) {
			return nil, bad("%s places tensor %q in %q, whose header does not have it", indexFile, tensor, shard)
		}
	}
	for shard, h := range headers {
		if !named[shard] {
			return nil, bad("%q is not named in %s: remove the stray shard (an engine may load it) or fix the index", shard, indexFile)
		}
		for _, t := range h.Tensors {
			if idx.WeightMap[t.Name] != shard {
				return nil, bad("tensor %q of %q is not in %s (it says %q)", t.Name, shard, indexFile, idx.WeightMap[t.Name])
			}
		}
	}
	return c, nil
}

func readHeaderFile(path string, size int64, rel string) (*stHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint file %q: %w", path, err)
	}
	defer f.Close()
	return readSafetensorsHeader(f, size, rel)
}

func (h *stHeader) has(name string) bool {
	for _, t := range h.Tensors {
		if t.Name == name {
			return true
		}
	}
	return false
}
