package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// The layer store (docs/data-and-grading.md §2.4): ROOT/layers/sha256/NAME/
// holds fs/ (one layer in overlayfs's form, an overlay lower directory) and
// layer.json. NAME is the layer's chain id (the OCI image spec's ChainID:
// the layer's diff id chained with those of every layer below it), not its
// diff id alone: a layer's directory depends on the layers below (the
// directories it writes below without listing them and the lower files it
// hard-links are copied up from them), so only layers with the same
// parents may share it. NAME.flat is a flattened group: the bottom layers
// up to that chain id applied into one directory.

// Lower-directory limits of a layered bundle: kernel overlayfs takes its
// mount options in one page (4,096 bytes), and the upper and work paths
// need their share, so a bundle has at most MaxLowers lowers whose paths
// together take at most maxLowerBytes; an image with more layers has its
// bottom layers flattened into one.
const (
	MaxLowers     = 32
	maxLowerBytes = 3000
	layersDir     = "layers"
	storeLockName = ".store.lock"
)

// LayerJSON is ROOT/layers/sha256/NAME/layer.json.
type LayerJSON struct {
	ChainID   string   `json:"chain_id"`
	DiffIDs   []string `json:"diff_ids"` // the layers applied, bottom first (more than one when flattened)
	SizeBytes int64    `json:"size_bytes"`
	Files     int64    `json:"files"`
	Notes     []string `json:"notes,omitempty"`
}

// chainIDs are the chain ids of a diff id list.
func chainIDs(diffs []v1.Hash) []v1.Hash {
	out := make([]v1.Hash, len(diffs))
	for i, d := range diffs {
		if i == 0 {
			out[i] = d
			continue
		}
		sum := sha256.Sum256([]byte(out[i-1].String() + " " + d.String()))
		out[i] = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	}
	return out
}

// layerGroup is one lower of a bundle: layers [from, to] of the image.
type layerGroup struct {
	from, to int
	name     string // sha256/<chain hex>, with .flat for a group of several
}

// planLowers groups n layers into lowers under the limits above: the
// bottom layers are flattened into one when there are too many.
func planLowers(root string, chains []v1.Hash) []layerGroup {
	n := len(chains)
	per := len(filepath.Join(root, layersDir, "sha256", strings.Repeat("0", 64)+".flat", "fs")) + 1
	limit := min(MaxLowers, maxLowerBytes/per)
	limit = max(limit, 1)
	var out []layerGroup
	first := 0
	if n > limit {
		first = n - limit + 1
		out = append(out, layerGroup{from: 0, to: first - 1, name: "sha256/" + chains[first-1].Hex + ".flat"})
	}
	for i := first; i < n; i++ {
		out = append(out, layerGroup{from: i, to: i, name: "sha256/" + chains[i].Hex})
	}
	return out
}

// layerPath is the directory of layer NAME (sha256/...) under root.
func layerPath(root, name string) string {
	return filepath.Join(root, layersDir, filepath.FromSlash(name))
}

// unpackLayered makes the layered bundle of res in tmp: every lower in the
// layer store (unpacked there unless present), then image.json, the lowers
// file and an empty rootfs/ (so that "BUNDLE/rootfs is a directory" holds
// for its readers; the sandbox mounts the lowers over it).
func (im *importer) unpackLayered(ctx context.Context, res *resolved, tmp string) (ImageJSON, error) {
	info := ImageJSON{Image: res.image, ManifestDigest: res.digest.String(), Source: res.source}
	p, err := prepare(res)
	if err != nil {
		return info, err
	}
	groups := planLowers(im.root, chainIDs(p.cfg.RootFS.DiffIDs))
	var lowers []string // absolute fs/ paths, top first
	var rel []string    // lowers file lines, bottom first
	for _, g := range groups {
		lj, err := im.ensureLayer(ctx, res, p, g, lowers)
		if err != nil {
			return info, err
		}
		info.SizeBytes += lj.SizeBytes
		info.Files += lj.Files
		info.Notes = append(info.Notes, lj.Notes...)
		info.Lowers = append(info.Lowers, layersDir+"/"+g.name)
		lowers = append([]string{filepath.Join(layerPath(im.root, g.name), "fs")}, lowers...)
		rel = append(rel, "../../"+layersDir+"/"+g.name+"/fs")
	}
	info.Layers = len(p.layers)
	if len(info.Notes) > 0 {
		counts := map[noteKind]int{}
		for _, n := range info.Notes {
			if strings.HasPrefix(n, "skipped device node") {
				counts[noteDeviceNode]++
			} else {
				counts[noteXattr]++
			}
		}
		im.log.Info("notes", "image", res.image, "summary", summarizeNotes(counts),
			"list", filepath.Join(im.root, BundleRel(res.digest), "image.json"))
	}
	if err := os.Mkdir(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return info, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "lowers"), []byte(strings.Join(rel, "\n")+"\n"), 0o644); err != nil {
		return info, err
	}
	if err := im.writeInfo(&info, p.cfg, tmp); err != nil {
		return info, err
	}
	if im.sync {
		if err := syncfs(tmp); err != nil {
			return info, fmt.Errorf("%s: sync: %w", p.where, err)
		}
	}
	return info, nil
}

// ensureLayer puts lower g of image p in the layer store unless it is
// there. A per-layer flock makes concurrent imports unpack it once; it is
// written into a temporary sibling, flushed and renamed into place, so a
// layer directory is complete or absent, as a bundle is. lowers are the
// fs/ directories below it, top first.
func (im *importer) ensureLayer(ctx context.Context, res *resolved, p imageParts, g layerGroup, lowers []string) (LayerJSON, error) {
	var lj LayerJSON
	final := layerPath(im.root, g.name)
	dir, base := filepath.Dir(final), filepath.Base(final)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return lj, fmt.Errorf("layer store %q: %w", dir, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "."+base+".lock"), im.log, res.image)
	if err != nil {
		return lj, err
	}
	defer unlock()
	if lj, ok, err := readLayer(final); ok || err != nil {
		if ok && err == nil {
			im.storeReused.Add(1)
		}
		return lj, err
	}
	old, _ := filepath.Glob(filepath.Join(dir, ".tmp-"+base+"-*"))
	for _, o := range old {
		im.log.Info("removing an interrupted layer unpack", "dir", o)
		if err := removeTree(o); err != nil {
			return lj, fmt.Errorf("remove interrupted layer unpack %q: %w", o, err)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-"+base+"-")
	if err != nil {
		return lj, err
	}
	ok := false
	defer func() {
		if !ok {
			removeTree(tmp)
		}
	}()
	fsDir := filepath.Join(tmp, "fs")
	if err := os.Mkdir(fsDir, 0o755); err != nil {
		return lj, err
	}
	u, err := newLayerUnpacker(fsDir, lowers)
	if err != nil {
		return lj, err
	}
	defer u.close()
	chains := chainIDs(p.cfg.RootFS.DiffIDs)
	lj.ChainID = chains[g.to].String()
	for i := g.from; i <= g.to; i++ {
		n, err := im.applyLayer(ctx, res, p, u, i)
		if err != nil {
			return lj, err
		}
		lj.SizeBytes += n
		lj.DiffIDs = append(lj.DiffIDs, p.cfg.RootFS.DiffIDs[i].String())
	}
	if err := u.finish(); err != nil {
		return lj, fmt.Errorf("%s: %w", p.where, err)
	}
	lj.Files, lj.Notes = u.entries, u.notes
	b, _ := json.MarshalIndent(lj, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "layer.json"), append(b, '\n'), 0o644); err != nil {
		return lj, err
	}
	if im.sync {
		if err := syncfs(tmp); err != nil {
			return lj, fmt.Errorf("%s: layer %s: sync: %w", p.where, g.name, err)
		}
	}
	im.fire(HookLayerBeforeRename)
	if err := os.Rename(tmp, final); err != nil {
		return lj, fmt.Errorf("%s: put layer %s in place at %q: %w", p.where, g.name, final, err)
	}
	ok = true
	im.storeUnpacked.Add(1)
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	im.fire(HookLayerPlaced)
	return lj, nil
}

// readLayer reads a layer in place; ok is false when there is none.
func readLayer(final string) (LayerJSON, bool, error) {
	var lj LayerJSON
	b, err := os.ReadFile(filepath.Join(final, "layer.json"))
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Lstat(final); errors.Is(serr, fs.ErrNotExist) {
			return lj, false, nil
		}
	}
	if err == nil {
		err = json.Unmarshal(b, &lj)
	}
	if err != nil {
		return lj, true, fmt.Errorf("layer %q is damaged: %v (remove it, and the bundles listing it, to re-import)", final, err)
	}
	return lj, true, nil
}

// lockStoreShared holds the layer store's lock shared for an import: gc
// takes it exclusive before collecting layers, so it never removes a
// layer an import in progress has made or found but not yet referenced
// from a bundle.
func lockStoreShared(root string) (func(), error) {
	p := filepath.Join(root, layersDir)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return nil, fmt.Errorf("layer store %q: %w", p, err)
	}
	f, err := os.OpenFile(filepath.Join(p, storeLockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("layer store lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("layer store lock %q: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
