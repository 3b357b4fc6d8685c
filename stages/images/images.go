// Package images is the kiln-images stage: it imports the task images of
// a tasks dataset into bundles (an unpacked rootfs/ plus image.json) named
// by manifest digest under a bundle root on each sandbox node, and records
// them as an images dataset. See importCommand's description for the
// contract and unpack.go for the layer writer's safety rules.
package images

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/urfave/cli/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

// importVersion is the import stage's code version (dataset.Identity):
// bump it whenever the same images would yield different rows.
const importVersion = "1"

// bundlesFlag is --bundles, the bundle root, as kiln-grade and kiln export
// name it too; --root is its deprecated alias.
func bundlesFlag(dst *string, usage string) cli.Flag {
	return &cli.StringFlag{Name: "bundles", Aliases: []string{"root"}, Destination: dst, Usage: usage + " (--root: deprecated alias)", Required: true}
}

// importFlags are import's flags, bound.
type importFlags struct {
	tasks, bundles, out     string
	jobs                    int
	layout                  string
	sources, envPathPrepend cli.StringSlice
	noSync, printVersion    bool
	// verify runs the verify gate on the committed images (verify.go).
	verify          bool
	verifyOut, gold string
}

// gcFlags are gc's flags, bound.
type gcFlags struct {
	bundles string
	keep    cli.StringSlice
	dryRun  bool
}

// Commands returns the kiln-images commands.
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{importCommand(env), buildCommand(env), gcCommand(env), duCommand(env), verifyCommand(env)}
}

func importCommand(env *stagecmd.Env) *cli.Command {
	f := &importFlags{}
	return &cli.Command{
		Name:  "import",
		Usage: "unpack the task images of a tasks dataset into bundles and record them",
		Description: `For each distinct image of the tasks (column image, first-seen order), finds
the image, verifies it (manifest, config and every layer against their sha256
digests) and unpacks its layers into a bundle under --bundles (ROOT):

   ROOT/sha256/<manifest hex>/image.json   {image, manifest_digest, env, cwd,
                                            command, source, layers, size_bytes,
                                            files, notes, lowers}
   ROOT/sha256/<manifest hex>/lowers       its layer directories, bottom first
   ROOT/sha256/<manifest hex>/rootfs/      empty: the sandbox mounts the lowers
   ROOT/layers/sha256/<chain id hex>/fs/   one layer, in overlayfs's form,
                                            unpacked once per node and shared
                                            by every bundle that has it

With --layout rootfs (and always when not root) a bundle is instead a whole
unpacked root filesystem in rootfs/, as tools outside kiln (the images-json
export) need. A bundle of either form already in place is reused as it is.
Images with more than 32 layers (or lower paths longer than the overlay mount
options allow) have their bottom layers flattened into one lower.

then writes an images dataset (--out) with one row per image: image, digest,
bundle (ROOT-relative, e.g. sha256/<hex>), env, workdir, config_workdir,
command, source, size_bytes, files, env_path_prepend. Run it on every
sandbox node with the same --bundles (the dataset commits once; bundles are made
on each node). kiln export images --format images-json --bundles ROOT writes the
SUNABAKO_IMAGES map from it.

Where images come from: --source KEY=KIND:PATH, repeatable, the longest
matching KEY wins. KEY is an exact image reference or a repository prefix (the
image is then KEY:TAG or KEY@DIGEST). KIND is
   oci             an OCI image layout directory; KEY:TAG selects the manifest
                   whose org.opencontainers.image.ref.name annotation is TAG
   oci-archive     a tar of an OCI image layout (same selection)
   docker-archive  a "docker save" tarball
Images no --source matches are pulled from their registry (credentials from
~/.docker/config.json and credential helpers, as docker uses them).

Bundles: a bundle is complete or absent. It is unpacked into a temporary
sibling directory and renamed into place, so an existing bundle is the reuse
signal: it is reused if its image.json has the same manifest_digest and a
rootfs/ directory, and is an error otherwise (remove it to re-import). A
per-digest lock (ROOT/sha256/.<hex>.lock) makes concurrent imports on one
node (Slurm array tasks) unpack each image once; an import killed midway
leaves only a temporary directory, which the next import removes. A tag that
moves to a new digest gets a new bundle. Layers follow the same rules: each
is unpacked into a temporary sibling under ROOT/layers/sha256/, flushed and
renamed into place, under a per-layer lock, so two imports sharing a layer
unpack it once.

Unpacking follows the OCI layer rules (whiteouts, opaque directories, hard
links, symlinks, modes, owners when run as root, rootless otherwise) and
refuses, naming the layer and entry, anything that could reach outside the
rootfs: ".." in names, writing through a symlink, hard links to paths outside
or behind symlinks, whiteouts of "." or "..". Device nodes are skipped (noted
in image.json); sandboxes provide /dev.

Workdir: a task's own workdir always wins. The tasks of one image must agree
on it (else "Conflicting workdirs for image I"); the row's workdir is theirs
and config_workdir (the image's WorkingDir) is kept for information only.
env is the image's Env unchanged, except --env-path-prepend IMAGE=DIR, which
puts DIR in front of PATH for that image (for toolchains under /root/.pyenv
that the unprivileged agent user must reach).

With --verify, once the images dataset is committed, the verify gate runs on
the tasks and those images (kiln-images verify --help; --gold and --verify-out
are its --gold and --out): its lines and grades reference come first, the
images reference last; exit 5 when an image fails the gate.

With --shard i/n the distinct images are dealt to parts (image k to part
k mod n); every part resolves all manifests, so all parts agree on the version.
The version id covers the tasks version, the sources, the overrides and every
image's manifest digest; --print-version therefore resolves the manifests (it
unpacks nothing).

Example:
   kiln-images import --tasks tasks/mimo --bundles /var/lib/kiln/images \
     --source kiln.local/fixtures=oci:/data/layout -j 4 --out images/mimo`,
		Flags:  importFlagList(f),
		Action: func(c *cli.Context) error { return runImport(c, env, f) },
	}
}

// importFlagList is import's flags (build takes them too), bound to f.
func importFlagList(f *importFlags) []cli.Flag {
	return []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "tasks", Destination: &f.tasks, Usage: "tasks dataset whose images to import (name or name@version)", Required: true},
		bundlesFlag(&f.bundles, "bundle root directory on this node (created if missing)"),
		&cli.StringFlag{Name: "out", Value: "images", Destination: &f.out, Usage: "images dataset name to write"},
		&cli.IntFlag{Name: "jobs", Aliases: []string{"j"}, Value: 2, Destination: &f.jobs, Usage: "images imported in parallel"},
		&cli.StringSliceFlag{Name: "source", Destination: &f.sources, Usage: "KEY=oci:DIR | KEY=oci-archive:FILE | KEY=docker-archive:FILE (repeatable)"},
		&cli.StringSliceFlag{Name: "env-path-prepend", Destination: &f.envPathPrepend, Usage: "IMAGE=DIR: put DIR in front of PATH in IMAGE's env (repeatable)"},
		&cli.StringFlag{Name: "layout", Value: "layered", Destination: &f.layout, Usage: "layered (layers shared in ROOT/layers, needs root) or rootfs (a whole unpacked rootfs per bundle; rootless imports always make these)"},
		&cli.BoolFlag{Name: "verify", Destination: &f.verify, Usage: "then run the verify gate (kiln-images verify --help) on the tasks and the images written; exit 5 if an image fails it"},
		&cli.StringFlag{Name: "verify-out", Value: "verify", Destination: &f.verifyOut, Usage: "with --verify: the grades dataset name the gate writes"},
		&cli.StringFlag{Name: "gold", Destination: &f.gold, Usage: `with --verify: gold patches, JSON lines {"task_id", "patch"} (default: each task's metadata "patch")`},
		&cli.BoolFlag{Name: "no-sync", Destination: &f.noSync, Usage: "do not flush a bundle to disk before putting it in place (faster; a power loss may then leave a damaged bundle that looks complete)"},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(&f.printVersion),
	}
}

// taskImage is one distinct image of the tasks.
type taskImage struct {
	image   string
	workdir *string
}

// readTaskImages lists the distinct images of a tasks version in first-seen
// order; the tasks of one image must agree on the workdir.
func readTaskImages(ctx context.Context, v *dataset.Version) ([]taskImage, error) {
	var out []taskImage
	seen := map[string]int{}
	first := map[string]string{}
	err := v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error {
			if t.Image == nil || strings.TrimSpace(*t.Image) == "" {
				return nil
			}
			im := *t.Image
			if i, ok := seen[im]; ok {
				if !sameWorkdir(out[i].workdir, t.Workdir) {
					// Capitalised: this and "No task images found" below are the reference's messages.
					return stagecmd.BadInputError{Err: fmt.Errorf("Conflicting workdirs for image %s: task %q has %s, task %q has %s",
						im, first[im], showWorkdir(out[i].workdir), t.TaskID, showWorkdir(t.Workdir))}
				}
				return nil
			}
			seen[im], first[im] = len(out), t.TaskID
			out = append(out, taskImage{image: im, workdir: t.Workdir})
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, stagecmd.BadInputError{Err: fmt.Errorf("No task images found in the prepared dataset %s: no task has an image", v.Ref())}
	}
	return out, nil
}

func sameWorkdir(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func showWorkdir(w *string) string {
	if w == nil {
		return "no workdir"
	}
	return fmt.Sprintf("%q", *w)
}

// importOptions configures an import.
type importOptions struct {
	root        string
	sources     []Source
	pathPrepend map[string]string
	jobs        int
	part        dataset.Part
	sync        bool
	layered     bool
	remote      []remote.Option
}

func runImport(c *cli.Context, env *stagecmd.Env, f *importFlags) error {
	if c.NArg() != 0 {
		return stagecmd.Usagef("import: takes no arguments (got %q); see --help", c.Args().First())
	}
	opts := importOptions{jobs: f.jobs, pathPrepend: map[string]string{}, sync: !f.noSync}
	if err := stagecmd.CheckCount("jobs", opts.jobs, stagecmd.MaxJobs); err != nil {
		return err
	}
	switch f.layout {
	case "layered":
		// The layered form needs root (whiteouts are character devices,
		// opaque directories trusted xattrs); so does the bwrap sandbox
		// that mounts it. Rootless imports make whole-rootfs bundles.
		opts.layered = os.Geteuid() == 0
		if !opts.layered {
			env.Log.Info("not root: making whole-rootfs bundles (--layout rootfs); the layered form needs root")
		}
	case "rootfs":
	default:
		return stagecmd.Usagef("import: --layout %q: want layered or rootfs", f.layout)
	}
	keys := map[string]bool{}
	for _, s := range f.sources.Value() {
		src, err := ParseSource(s)
		if err != nil {
			return stagecmd.UsageError{Err: err}
		}
		if keys[src.Key] {
			return stagecmd.Usagef("import: --source key %q given twice", src.Key)
		}
		keys[src.Key] = true
		opts.sources = append(opts.sources, src)
	}
	for _, s := range f.envPathPrepend.Value() {
		im, dir, ok := strings.Cut(s, "=")
		if !ok || im == "" || dir == "" {
			return stagecmd.Usagef("import: --env-path-prepend %q: want IMAGE=DIR", s)
		}
		opts.pathPrepend[im] = dir
	}
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	if opts.part, err = stagecmd.PartFrom(c); err != nil {
		return err
	}
	ctx := c.Context
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{f.tasks}, opts.part)
	if err != nil {
		return err
	}
	v, err := dataset.OpenKind(ctx, st, inputs[0], records.TasksKind(), "import: --tasks")
	if err != nil {
		return err
	}
	tasks, err := readTaskImages(ctx, v)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, t := range tasks {
		known[t.image] = true
	}
	for im := range opts.pathPrepend {
		if !known[im] {
			return stagecmd.Usagef("import: --env-path-prepend names image %q, which no task of %s uses", im, inputs[0])
		}
	}
	if opts.root, err = absRoot(f.bundles); err != nil {
		return stagecmd.UsageError{Err: err}
	}
	res := newResolver(opts.sources, filepath.Join(opts.root, ".sources"), opts.remote)
	res.have = func(h v1.Hash) bool {
		_, ok, err := readBundle(filepath.Join(opts.root, h.Algorithm, h.Hex), "", h.String())
		return ok && err == nil
	}
	defer res.close()
	resolved, err := resolveAll(ctx, res, tasks, opts.jobs)
	if err != nil {
		return err
	}
	var srcs []string
	for _, s := range opts.sources {
		srcs = append(srcs, s.String())
	}
	var digests [][2]string
	for _, r := range resolved {
		digests = append(digests, [2]string{r.image, r.digest.String()})
	}
	id := dataset.Identity{Stage: "images-import", CodeVersion: importVersion, Inputs: inputs,
		Args: map[string]any{"sources": srcs, "env_path_prepend": opts.pathPrepend, "images": digests}}
	out := stagecmd.Output{Name: f.out, Kind: records.ImagesKind(), Identity: id, Part: opts.part,
		PrintVersion: f.printVersion, Hook: env.Hook}
	if out.PrintVersion {
		_, err := stagecmd.Write(ctx, st, out, env.Stdout, env.Log, nil)
		return err
	}
	if f.verify && opts.part.Count > 1 {
		return stagecmd.Usagef("import: --verify with --shard %s: the gate needs the whole images version; run kiln-images verify once every part is committed", opts.part)
	}
	rows, metrics, err := importImages(ctx, env, opts, tasks, resolved)
	if err != nil {
		return err
	}
	// With --verify the images reference is held back and printed last,
	// after the gate's lines and reference: pipelines read the last line.
	stdout := env.Stdout
	var held bytes.Buffer
	if f.verify {
		stdout = &held
	}
	written, err := stagecmd.Write(ctx, st, out, stdout, env.Log, func(ctx context.Context, w *dataset.Writer) (map[string]any, error) {
		_, err := w.WriteShard(ctx, int64(len(rows)), nil, func(wr io.Writer) error {
			enc := records.NewImageEncoder(wr)
			if err := enc.Write(rows...); err != nil {
				return err
			}
			return enc.Close()
		})
		return metrics, err
	})
	if err != nil || !f.verify {
		return err
	}
	_, verr := Verify(ctx, env, st, VerifyOptions{Tasks: inputs[0].String(), Images: written.Ref.String(), Bundles: opts.root,
		Gold: f.gold, Out: f.verifyOut, Jobs: opts.jobs, Timeout: grade.DefaultTimeout})
	if _, err := env.Stdout.Write(held.Bytes()); err != nil {
		return err
	}
	return verr
}

// absRoot makes the bundle root absolute with symlinks resolved (creating
// it), so the rootfs paths derived from it are the same on every node.
func absRoot(root string) (string, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("--bundles %q: %w", root, err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("--bundles %q: %w", root, err)
	}
	return filepath.EvalSymlinks(abs)
}

func resolveAll(ctx context.Context, r *resolver, tasks []taskImage, jobs int) ([]*resolved, error) {
	out := make([]*resolved, len(tasks))
	var g errgroup.Group
	g.SetLimit(jobs)
	for i, t := range tasks {
		g.Go(func() error {
			// ctx, not a group context: a registry image keeps it for the
			// blob fetches of the import that follows.
			res, err := r.resolve(ctx, t.image)
			out[i] = res
			return err
		})
	}
	return out, g.Wait()
}

// importImages makes the bundles of this part's images, -j at a time, and
// returns their rows in first-seen order and the run's metrics.
func importImages(ctx context.Context, env *stagecmd.Env, opts importOptions, tasks []taskImage, resolved []*resolved) ([]records.Image, map[string]any, error) {
	im := &importer{root: opts.root, rootless: os.Geteuid() != 0, log: env.Log, stderr: env.Stderr, hook: env.Hook, sync: opts.sync, layered: opts.layered}
	// Held shared until the bundles are in place: gc collects layers only
	// while no import runs (store.go).
	unlockStore, err := lockStoreShared(opts.root)
	if err != nil {
		return nil, nil, err
	}
	defer unlockStore()
	rows := make([]records.Image, len(tasks))
	owned := make([]bool, len(tasks))
	var mu sync.Mutex
	metrics := map[string]any{"images": 0, "unpacked": 0, "reused": 0, "layers_unpacked": 0, "bytes_unpacked": int64(0), "files_unpacked": int64(0)}
	add := func(k string, n int64) {
		switch v := metrics[k].(type) {
		case int:
			metrics[k] = v + int(n)
		case int64:
			metrics[k] = v + n
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.jobs)
	for i, t := range tasks {
		if !opts.part.Owns(i) {
			continue
		}
		owned[i] = true
		res := resolved[i]
		g.Go(func() error {
			info, unpacked, err := im.ensure(gctx, res)
			if err != nil {
				return err
			}
			row, err := imageRow(t, res, info, opts.pathPrepend[t.image])
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			rows[i] = row
			add("images", 1)
			if unpacked {
				add("unpacked", 1)
				add("layers_unpacked", int64(info.Layers))
				add("bytes_unpacked", info.SizeBytes)
				add("files_unpacked", info.Files)
			} else {
				add("reused", 1)
			}
			env.Log.Info("bundle ready", "image", t.image, "digest", res.digest.String(), "bundle", row.Bundle, "unpacked", unpacked, "layers", info.Layers, "bytes", info.SizeBytes)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	var out []records.Image
	var bundleBytes int64
	for i := range rows {
		if owned[i] {
			out = append(out, rows[i])
			bundleBytes += rows[i].SizeBytes
		}
	}
	logDisk(env, opts.root, bundleBytes)
	metrics["store_layers_unpacked"], metrics["store_layers_reused"] = im.storeUnpacked.Load(), im.storeReused.Load()
	env.Log.Info("images imported", "images", metrics["images"], "unpacked", metrics["unpacked"], "reused", metrics["reused"],
		"bytes_unpacked", metrics["bytes_unpacked"], "store_layers_unpacked", metrics["store_layers_unpacked"], "store_layers_reused", metrics["store_layers_reused"])
	return out, metrics, nil
}

// logDisk reports the bundle root's filesystem usage after an import.
func logDisk(env *stagecmd.Env, root string, bundleBytes int64) {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return
	}
	total, free := int64(fs.Blocks)*fs.Bsize, int64(fs.Bavail)*fs.Bsize
	env.Log.Info("disk usage", "root", root, "bundles_bytes", bundleBytes, "fs_used_bytes", total-int64(fs.Bfree)*fs.Bsize, "fs_free_bytes", free)
}

// imageRow builds the images row of one task image.
func imageRow(t taskImage, res *resolved, info ImageJSON, prepend string) (records.Image, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, info.Env); err != nil {
		return records.Image{}, fmt.Errorf("image %q: image.json env: %w", t.image, err)
	}
	env := json.RawMessage(compact.Bytes())
	var pp *string
	if prepend != "" {
		var err error
		if env, err = prependPath(env, prepend); err != nil {
			return records.Image{}, fmt.Errorf("image %q: env: %w", t.image, err)
		}
		pp = &prepend
	}
	cmd := info.Command
	if cmd == nil {
		cmd = []string{}
	}
	cb, _ := json.Marshal(cmd)
	if len(env) == 0 {
		env = json.RawMessage("{}")
	}
	return records.Image{Image: t.image, Digest: res.digest.String(), Bundle: BundleRel(res.digest), Env: string(env),
		Workdir: t.workdir, ConfigWorkdir: info.Cwd, Command: string(cb), Source: res.source,
		SizeBytes: info.SizeBytes, Files: info.Files, EnvPathPrepend: pp}, nil
}

// prependPath puts dir in front of PATH in an ordered env object (PATH is
// added last when absent).
func prependPath(env json.RawMessage, dir string) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(env))
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	var keys []string
	vals := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v string
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		vals[tok.(string)] = v
	}
	if old, ok := vals["PATH"]; ok && old != "" {
		vals["PATH"] = dir + ":" + old
	} else {
		if !ok {
			keys = append(keys, "PATH")
		}
		vals["PATH"] = dir
	}
	var list []string
	for _, k := range keys {
		list = append(list, k+"="+vals[k])
	}
	return envObject(list), nil
}

func gcCommand(env *stagecmd.Env) *cli.Command {
	f := &gcFlags{}
	return &cli.Command{
		Name:  "gc",
		Usage: "remove bundles that no kept images dataset references",
		Description: `Removes every bundle under --bundles that none of the --keep images datasets
names, and temporary directories left by killed imports; then every layer of
the layer store (ROOT/layers) that no bundle left on the node lists. Layers
are collected only while no import runs (an import holds the store's lock
from its first layer until its bundles are in place); otherwise they are
left for the next gc, which says so. A bundle whose
import lock is held (an import is running) is left alone. A bundle is first
renamed aside, then deleted, so it never looks complete while half-deleted.
Sandboxes still running on a removed bundle lose their image: run gc between
jobs.

Example:
   kiln-images gc --bundles /var/lib/kiln/images --keep images/mimo --keep images/swe
   kiln-images gc -n --bundles /var/lib/kiln/images --keep images/mimo`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			bundlesFlag(&f.bundles, "bundle root directory"),
			&cli.StringSliceFlag{Name: "keep", Destination: &f.keep, Usage: "images dataset whose bundles to keep (name or name@version; repeatable)", Required: true},
			&cli.BoolFlag{Name: "dry-run", Aliases: []string{"n"}, Destination: &f.dryRun, Usage: "only print what would be removed"},
		},
		Action: func(c *cli.Context) error { return runGC(c, env, f) },
	}
}

func runGC(c *cli.Context, env *stagecmd.Env, f *gcFlags) error {
	st, err := stagecmd.OpenExistingStore(c)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, ref := range f.keep.Value() {
		r, err := dataset.ParseRef(ref)
		if err != nil {
			return err
		}
		v, err := dataset.OpenKind(c.Context, st, r, records.ImagesKind(), "gc: --keep")
		if err != nil {
			return err
		}
		err = v.EachShard(c.Context, func(_ int, data []byte) error {
			return records.EachImage(data, func(im records.Image) error {
				keep[im.Bundle] = true
				return nil
			})
		})
		if err != nil {
			return err
		}
	}
	root := f.bundles
	algos, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("gc: --bundles %q: %w", root, err)
	}
	dry := f.dryRun
	verb := "removed"
	if dry {
		verb = "would remove"
	}
	var removed []string
	for _, a := range algos {
		if !a.IsDir() || strings.HasPrefix(a.Name(), ".") || a.Name() == layersDir {
			continue
		}
		dir := filepath.Join(root, a.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("gc: %w", err)
		}
		for _, e := range ents {
			n := e.Name()
			var hexd string
			switch {
			case strings.HasPrefix(n, ".gc-"): // a gc killed midway
				hexd = "gc"
			case strings.HasPrefix(n, ".tmp-"):
				hexd, _, _ = strings.Cut(strings.TrimPrefix(n, ".tmp-"), "-")
			case strings.HasPrefix(n, "."), !e.IsDir():
				continue
			case keep[a.Name()+"/"+n]:
				continue
			default:
				hexd = n
			}
			unlock, ok := tryLock(filepath.Join(dir, "."+hexd+".lock"))
			if !ok {
				env.Log.Info("an import holds this bundle's lock; left alone", "bundle", a.Name()+"/"+n)
				continue
			}
			if !dry {
				err = removeBundle(dir, n)
			}
			unlock()
			if err != nil {
				return fmt.Errorf("gc: remove %q: %w", filepath.Join(dir, n), err)
			}
			removed = append(removed, a.Name()+"/"+n)
		}
	}
	layers, err := gcLayers(env, root, removed, dry)
	if err != nil {
		return err
	}
	removed = append(removed, layers...)
	sort.Strings(removed)
	for _, r := range removed {
		stagecmd.Fprintln(c, verb, r)
	}
	env.Log.Info("gc done", "removed", len(removed), "dry_run", dry)
	return nil
}

// gcLayers removes the layers (and killed unpacks' temporary directories)
// of the layer store that no bundle left on the node lists (gone: the
// bundles gc removes, or would with -n). It holds the store lock
// exclusive, so no import is between making or finding a layer and
// putting the bundle that lists it in place; when an import holds it
// shared, layers are left for the next gc.
func gcLayers(env *stagecmd.Env, root string, gone []string, dry bool) ([]string, error) {
	dir := filepath.Join(root, layersDir, "sha256")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	unlock, ok := tryLock(filepath.Join(root, layersDir, storeLockName))
	if !ok {
		env.Log.Info("an import is running: layers left alone; run gc again once it is done")
		return nil, nil
	}
	defer unlock()
	skip := map[string]bool{}
	for _, g := range gone {
		skip[g] = true
	}
	used := map[string]bool{}
	bundles, _ := filepath.Glob(filepath.Join(root, "*", "*", "image.json"))
	for _, b := range bundles {
		rel, _ := filepath.Rel(root, filepath.Dir(b))
		if skip[filepath.ToSlash(rel)] || strings.HasPrefix(rel, layersDir+string(filepath.Separator)) {
			continue
		}
		data, err := os.ReadFile(b)
		var info ImageJSON
		if err == nil {
			err = json.Unmarshal(data, &info)
		}
		if err != nil {
			// Its layers are unknown: collecting any could break it.
			return nil, fmt.Errorf("gc: bundle %q: image.json: %w; layers left alone (remove or re-import that bundle, then run gc again)", filepath.Dir(b), err)
		}
		for _, l := range info.Lowers {
			used[l] = true
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	var removed []string
	for _, e := range ents {
		n := e.Name()
		lock := n
		switch {
		case strings.HasPrefix(n, ".gc-"):
			lock = "gc"
		case strings.HasPrefix(n, ".tmp-"):
			lock, _, _ = strings.Cut(strings.TrimPrefix(n, ".tmp-"), "-")
		case strings.HasPrefix(n, "."), !e.IsDir(), used[layersDir+"/sha256/"+n]:
			continue
		}
		unlockLayer, ok := tryLock(filepath.Join(dir, "."+lock+".lock"))
		if !ok {
			continue
		}
		if !dry {
			err = removeBundle(dir, n)
		}
		unlockLayer()
		if err != nil {
			return nil, fmt.Errorf("gc: remove layer %q: %w", filepath.Join(dir, n), err)
		}
		removed = append(removed, layersDir+"/sha256/"+n)
	}
	return removed, nil
}

// removeBundle renames a bundle aside (so it stops being the reuse signal
// at once) and deletes it.
func removeBundle(dir, name string) error {
	p := filepath.Join(dir, name)
	if !strings.HasPrefix(name, ".") {
		aside, err := os.MkdirTemp(dir, ".gc-")
		if err != nil {
			return err
		}
		if err := os.Rename(p, filepath.Join(aside, name)); err != nil {
			os.Remove(aside)
			return err
		}
		p = aside
	}
	return removeTree(p)
}
