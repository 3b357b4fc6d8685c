package images

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// duFlags are du's flags, bound.
type duFlags struct {
	bundles string
	images  cli.StringSlice
}

func duCommand(env *stagecmd.Env) *cli.Command {
	f := &duFlags{}
	return &cli.Command{
		Name:  "du",
		Usage: "report the disk use of the bundle root per layer and per images dataset",
		Description: `Reads every bundle on this node under --bundles and prints, one line each:

   layer   NAME  BYTES  bundles=N             every layer-store directory
                                              (a whole-rootfs bundle counts
                                              as one layer, sha256/<hex>/rootfs)
   dataset REF   bundles=N layers=M bytes=T unique=U shared=S
   total   layers=M bytes=T images_bytes=I

BYTES is disk use (allocated blocks, a file with several names once). For
each --images dataset (repeatable; with none, all bundles of the node form
one group named "node"), bytes is the disk use of the layers its bundles
list; unique the part no other --images dataset's bundles list, shared the
rest. images_bytes is what the bundles would take unpacked one rootfs per
image (their size_bytes summed): total bytes over images_bytes is what
sharing layers saves. It only reads.

Example:
   kiln-images du --bundles /var/lib/kiln/images --images images/mimo --images images/swe`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			bundlesFlag(&f.bundles, "bundle root directory"),
			&cli.StringSliceFlag{Name: "images", Destination: &f.images, Usage: "images dataset to report (name or name@version; repeatable)"},
		},
		Action: func(c *cli.Context) error { return runDU(c, f) },
	}
}

func runDU(c *cli.Context, f *duFlags) error {
	root := f.bundles
	bundles, err := filepath.Glob(filepath.Join(root, "*", "*", "image.json"))
	if err != nil {
		return err
	}
	layersOf := map[string][]string{} // bundle (sha256/<hex>) -> its layers
	var imagesBytes int64
	for _, b := range bundles {
		rel, _ := filepath.Rel(root, filepath.Dir(b))
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, layersDir+"/") {
			continue
		}
		data, err := os.ReadFile(b)
		var info ImageJSON
		if err == nil {
			err = json.Unmarshal(data, &info)
		}
		if err != nil {
			return fmt.Errorf("du: bundle %q: image.json: %w (remove the bundle to re-import it)", filepath.Dir(b), err)
		}
		imagesBytes += info.SizeBytes
		if len(info.Lowers) == 0 {
			layersOf[rel] = []string{rel + "/rootfs"}
		} else {
			layersOf[rel] = info.Lowers
		}
	}
	groups := map[string][]string{} // group -> bundles
	var order []string
	if len(f.images.Value()) == 0 {
		order = []string{"node"}
		for b := range layersOf {
			groups["node"] = append(groups["node"], b)
		}
	} else {
		st, err := stagecmd.OpenExistingStore(c)
		if err != nil {
			return err
		}
		for _, ref := range f.images.Value() {
			r, err := dataset.ParseRef(ref)
			if err != nil {
				return err
			}
			v, err := dataset.OpenKind(c.Context, st, r, records.ImagesKind(), "du: --images")
			if err != nil {
				return err
			}
			name := v.Ref().String()
			order = append(order, name)
			err = v.EachShard(c.Context, func(_ int, data []byte) error {
				return records.EachImage(data, func(im records.Image) error {
					groups[name] = append(groups[name], im.Bundle)
					return nil
				})
			})
			if err != nil {
				return err
			}
		}
	}
	// Layer sizes, and which groups and bundles list each.
	size := map[string]int64{}
	users := map[string]int{}
	for _, ls := range layersOf {
		for _, l := range ls {
			users[l]++
			if _, ok := size[l]; !ok {
				p := filepath.Join(root, filepath.FromSlash(l))
				if !strings.HasSuffix(l, "/rootfs") {
					p = filepath.Join(p, "fs")
				}
				if size[l], err = diskUse(p); err != nil {
					return fmt.Errorf("du: layer %q: %w", l, err)
				}
			}
		}
	}
	inGroups := map[string]map[string]bool{}
	for g, bs := range groups {
		for _, b := range bs {
			for _, l := range layersOf[b] {
				if inGroups[l] == nil {
					inGroups[l] = map[string]bool{}
				}
				inGroups[l][g] = true
			}
		}
	}
	names := make([]string, 0, len(size))
	var total int64
	for l, n := range size {
		names = append(names, l)
		total += n
	}
	sort.Strings(names)
	for _, l := range names {
		stagecmd.Fprintln(c, fmt.Sprintf("layer\t%s\t%d\tbundles=%d", l, size[l], users[l]))
	}
	for _, g := range order {
		seen := map[string]bool{}
		var bytes, unique int64
		for _, b := range groups[g] {
			for _, l := range layersOf[b] {
				if seen[l] {
					continue
				}
				seen[l] = true
				bytes += size[l]
				if len(inGroups[l]) == 1 {
					unique += size[l]
				}
			}
		}
		stagecmd.Fprintln(c, fmt.Sprintf("dataset\t%s\tbundles=%d layers=%d bytes=%d unique=%d shared=%d", g, len(groups[g]), len(seen), bytes, unique, bytes-unique))
	}
	stagecmd.Fprintln(c, fmt.Sprintf("total\tlayers=%d bytes=%d images_bytes=%d", len(size), total, imagesBytes))
	return nil
}

// diskUse is the allocated size of a tree, a file with several names
// counted once.
func diskUse(dir string) (int64, error) {
	var n int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		n += st.Blocks * 512
		return nil
	})
	return n, err
}
