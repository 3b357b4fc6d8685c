package images

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/harbor"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// buildHelp is kiln-images build's manual.
const buildHelp = `Builds the images of Harbor tasks that come with environment/Dockerfile
(kiln convert harbor names them kiln.local/harbor-build:<sha256 of environment/>
and stores environment/ as an attachment of the tasks version), then imports
every image of the tasks exactly as kiln-images import does (same flags, same
bundles, same images dataset): a built image lands as a bundle like any other.

Per distinct build context, with buildah (Debian's package; no daemon):
   1. resolve every FROM image through the same sources import uses (--source
      KEY=oci:DIR, oci-archive:FILE, docker-archive:FILE, else its registry),
      so the fixtures' base builds offline;
   2. the cache key is the sha256 of the context and of those FROM manifest
      digests: when BUILD-CACHE/<key>/layout is complete the image is reused
      and nothing is built (a changed context, or a FROM that now names
      another manifest, builds again);
   3. otherwise the FROM images go into the build's OCI layout, layers
      uncompressed (hard-linked from an oci: source that stores them so,
      else decompressed once into BUILD-CACHE/.bases, which every later
      build FROM the same base links to),
      buildah pulls them from it (tagged with the name the Dockerfile uses), then
      buildah bud --isolation chroot --pull-never, as root, with buildah
      storage of its own under BUILD-CACHE/buildah (removed after), bounded
      by the task's [environment].build_timeout_sec (else --build-timeout);
      the result is pushed into the same layout (blobs it holds are not
      written again), which becomes BUILD-CACHE/<key>/layout, and is
      imported from there.
Builds sharing one BUILD-CACHE may run at once (several tasks versions, or
nodes on a shared disk): a lock per cache key builds each context once (a
second build waits, then reuses it), and separate storage keeps the builds of
other contexts apart.

A step that fails (a RUN exiting non-zero) is exit 5 naming the task and the
step, with the end of buildah's log; the whole log is kept at
BUILD-CACHE/<key>.log. A task whose environment is a docker-compose.yaml is
refused (exit 5): kiln runs one container per task. FROM lines using build
arguments ($VAR) and multi-platform builds are not supported.

Example:
   kiln-images build --tasks tasks/harbor --bundles /var/lib/kiln/images \
     --source kiln.local/fixtures=oci:/data/layout --out images/harbor`

func buildCommand(env *stagecmd.Env) *cli.Command {
	f := &importFlags{}
	var cache, buildah, driver string
	var timeout time.Duration
	fl := append(importFlagList(f),
		&cli.StringFlag{Name: "build-cache", Destination: &cache, Usage: "where built images and buildah's storage live (default: BUNDLES/harbor-build)"},
		&cli.StringFlag{Name: "buildah", Value: "buildah", Destination: &buildah, Usage: "the buildah binary"},
		&cli.StringFlag{Name: "storage-driver", Value: "overlay", Destination: &driver, Usage: "buildah's storage driver: overlay, or vfs where overlay cannot mount (slower: copies every layer)"},
		&cli.DurationFlag{Name: "build-timeout", Value: 30 * time.Minute, Destination: &timeout, Usage: "limit of one build whose task names no build_timeout_sec"},
	)
	return &cli.Command{
		Name: "build", Usage: "build Harbor tasks' environment/Dockerfile images with buildah, then import every image of the tasks",
		Description: buildHelp, Flags: fl,
		Action: func(c *cli.Context) error {
			if cache == "" {
				cache = filepath.Join(f.bundles, "harbor-build")
			}
			b := &builder{env: env, cache: cache, buildah: buildah, timeout: timeout, driver: driver}
			if err := b.run(c, f); err != nil {
				return err
			}
			return runImport(c, env, f)
		},
	}
}

// builder builds the Harbor environments of one tasks version.
type builder struct {
	env     *stagecmd.Env
	cache   string
	buildah string
	driver  string
	timeout time.Duration
}

// buildSpec is one distinct build context.
type buildSpec struct {
	image   string // kiln.local/harbor-build:<context sha256>
	task    string // the first task naming it (for messages)
	context string // the attachment holding environment/
	timeout time.Duration
}

// harborMetadata is what build reads of a task's metadata (kiln convert
// harbor writes it).
type harborMetadata struct {
	Harbor *struct {
		Build *struct {
			Context    string  `json:"context"`
			TimeoutSec float64 `json:"timeout_sec"`
		} `json:"build"`
		Compose bool `json:"compose"`
	} `json:"harbor"`
}

// run builds what is missing and adds a --source for every built image.
func (b *builder) run(c *cli.Context, f *importFlags) error {
	ctx := c.Context
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	inputs, err := stagecmd.ResolveInputs(ctx, st, []string{f.tasks}, dataset.Part{})
	if err != nil {
		return err
	}
	v, err := dataset.OpenKind(ctx, st, inputs[0], records.TasksKind(), "build: --tasks")
	if err != nil {
		return err
	}
	var specs []buildSpec
	seen := map[string]bool{}
	err = v.EachShard(ctx, func(_ int, data []byte) error {
		return records.EachTask(data, func(t records.Task) error {
			var md harborMetadata
			_ = json.Unmarshal([]byte(t.Metadata), &md)
			if md.Harbor == nil {
				return nil
			}
			if md.Harbor.Compose && md.Harbor.Build == nil && (t.Image == nil || strings.HasPrefix(*t.Image, "kiln.local/harbor-build:")) {
				return stagecmd.BadInputf("task %q: its environment is a docker-compose.yaml: kiln-images build builds one Dockerfile per task, and kiln runs one container per task, so compose environments (several services, networks, volumes) are not supported", t.TaskID)
			}
			if md.Harbor.Build == nil || t.Image == nil || seen[*t.Image] {
				return nil
			}
			seen[*t.Image] = true
			s := buildSpec{image: *t.Image, task: t.TaskID, context: md.Harbor.Build.Context, timeout: b.timeout}
			if md.Harbor.Build.TimeoutSec > 0 {
				s.timeout = time.Duration(md.Harbor.Build.TimeoutSec * float64(time.Second))
			}
			specs = append(specs, s)
			return nil
		})
	})
	if err != nil || len(specs) == 0 {
		return err
	}
	var sources []Source
	for _, s := range f.sources.Value() {
		src, err := ParseSource(s)
		if err != nil {
			return stagecmd.UsageError{Err: err}
		}
		sources = append(sources, src)
	}
	if err := os.MkdirAll(b.cache, 0o755); err != nil {
		return fmt.Errorf("--build-cache %q: %w", b.cache, err)
	}
	// Absolute: buildah runs in other directories and reaches the cache
	// through a symlink (the build's work/layout).
	abs, err := filepath.Abs(b.cache)
	if err != nil {
		return fmt.Errorf("--build-cache %q: %w", b.cache, err)
	}
	b.cache = abs
	res := newResolver(sources, filepath.Join(b.cache, ".sources"), nil)
	defer res.close()
	built, reused := 0, 0
	for _, s := range specs {
		dir, fresh, err := b.build(ctx, v, res, s)
		if err != nil {
			return err
		}
		if fresh {
			built++
		} else {
			reused++
		}
		if err := f.sources.Set(s.image + "=" + SourceOCI + ":" + dir); err != nil {
			return err
		}
	}
	fmt.Fprintf(b.env.Stderr, "build: %d image(s) built, %d reused from %s\n", built, reused, b.cache)
	b.env.Log.Info("harbor environments", "built", built, "reused", reused, "cache", b.cache)
	return nil
}

var fromLine = regexp.MustCompile(`(?i)^\s*FROM\s+(.*)$`)

// fromImages lists the images a Dockerfile's FROM lines name, in order,
// leaving out scratch and earlier stages' names.
func fromImages(dockerfile string) ([]string, error) {
	var out []string
	stages := map[string]bool{}
	for i, line := range strings.Split(dockerfile, "\n") {
		m := fromLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var words []string
		for _, w := range strings.Fields(m[1]) {
			if !strings.HasPrefix(w, "--") {
				words = append(words, w)
			}
		}
		if len(words) == 0 {
			return nil, fmt.Errorf("Dockerfile line %d: FROM without an image", i+1)
		}
		img := words[0]
		switch {
		case strings.Contains(img, "$"):
			return nil, fmt.Errorf("Dockerfile line %d: FROM %s uses a build argument, which kiln-images build does not resolve", i+1, img)
		case img != "scratch" && !stages[strings.ToLower(img)]:
			out = append(out, img)
		}
		if len(words) >= 3 && strings.EqualFold(words[1], "AS") {
			stages[strings.ToLower(words[2])] = true
		}
	}
	return out, nil
}

// build makes one context's image unless the cache has it; it returns the
// OCI layout holding it and whether it was built now.
func (b *builder) build(ctx context.Context, v *dataset.Version, res *resolver, s buildSpec) (string, bool, error) {
	rc, _, err := v.OpenAttachment(ctx, s.context)
	if err != nil {
		return "", false, stagecmd.BadInputError{Err: fmt.Errorf("task %q: its build context: %w", s.task, err)}
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return "", false, err
	}
	work, err := os.MkdirTemp("", "kilnbuild")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(work)
	ctxDir := filepath.Join(work, "context")
	if err := harbor.UntarDir(data, ctxDir); err != nil {
		return "", false, stagecmd.BadInputError{Err: fmt.Errorf("task %q: its build context: %w", s.task, err)}
	}
	df, err := os.ReadFile(filepath.Join(ctxDir, "Dockerfile"))
	if err != nil {
		return "", false, stagecmd.BadInputError{Err: fmt.Errorf("task %q: its build context has no Dockerfile: %w", s.task, err)}
	}
	froms, err := fromImages(string(df))
	if err != nil {
		return "", false, stagecmd.BadInputError{Err: fmt.Errorf("task %q: environment/%w", s.task, err)}
	}
	// The key: the context and what every FROM resolves to now.
	h := sha256.New()
	sum := sha256.Sum256(data)
	fmt.Fprintf(h, "context %x\n", sum)
	var bases []*resolved
	for _, img := range froms {
		r, err := res.resolve(ctx, img)
		if err != nil {
			return "", false, fmt.Errorf("task %q: FROM %s: %w", s.task, img, err)
		}
		fmt.Fprintf(h, "from %s %s\n", img, r.digest)
		bases = append(bases, r)
	}
	key := hex.EncodeToString(h.Sum(nil))
	final := filepath.Join(b.cache, key, "layout")
	done := filepath.Join(b.cache, key, "done")
	if _, err := os.Stat(done); err == nil {
		return final, false, nil
	}
	// One build of a key at a time, across processes sharing the cache:
	// the second waits and then finds the first's result.
	unlock, err := lockFile(ctx, filepath.Join(b.cache, key+".lock"), b.env.Log, s.image)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if _, err := os.Stat(done); err == nil {
		return final, false, nil
	}
	// Each build has buildah storage of its own (and removes it), so
	// concurrent builds of other keys never see each other's images.
	bs, err := b.newStorage()
	if err != nil {
		return "", false, err
	}
	defer bs.remove(b)
	bctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	logPath := filepath.Join(b.cache, key+".log")
	var log bytes.Buffer
	tag := "kiln-build-" + key[:32]
	// The build's OCI layout, BUILD-CACHE/<key>/layout once complete:
	// the FROM images go in first, layers uncompressed (writeBase),
	// buildah pulls them from it and pushes the result into it. A blob
	// the layout holds already is not written again, so the push writes
	// only the new layers: 0.1 s, not the 9 s of a whole 390 MB image
	// (BenchmarkBuildHarbor, 2026-12-05).
	tmp := filepath.Join(b.cache, key, ".layout.tmp")
	os.RemoveAll(tmp) // a killed build's; the lock is ours
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return "", false, err
	}
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return "", false, err
	}
	// buildah names an oci: image after its path, so the path must be a
	// valid repository name: a link under a fresh temp dir.
	link := filepath.Join(work, "layout")
	if err := os.Symlink(tmp, link); err != nil {
		return "", false, err
	}
	shared := layout.Path(filepath.Join(b.cache, ".bases"))
	for i, r := range bases {
		ref := fmt.Sprintf("base%d", i)
		if err := writeBase(p, shared, bs.dir, r, ref); err != nil {
			return "", false, fmt.Errorf("task %q: FROM %s: writing it for buildah: %w", s.task, r.image, err)
		}
		out, err := b.buildahCmd(bctx, bs.dir, &log, "pull", "--quiet", "oci:"+link+":"+ref)
		if err != nil {
			return "", false, fmt.Errorf("task %q: buildah pull of FROM %s (%s): %w", s.task, r.image, logTail(log.String(), 20), err)
		}
		id := lastOutputLine(out)
		if _, err := b.buildahCmd(bctx, bs.dir, &log, "tag", id, r.image); err != nil {
			return "", false, fmt.Errorf("task %q: buildah tag %s: %w", s.task, r.image, err)
		}
	}
	_, err = b.buildahCmd(bctx, bs.dir, &log, "bud", "--isolation", "chroot", "--pull-never", "--layers=false",
		"-f", filepath.Join(ctxDir, "Dockerfile"), "-t", tag, ctxDir)
	_ = os.WriteFile(logPath, log.Bytes(), 0o644)
	if err != nil {
		if bctx.Err() != nil {
			return "", false, stagecmd.BadInputf("task %q: building environment/Dockerfile took longer than %s (build_timeout_sec); log %q", s.task, s.timeout, logPath)
		}
		return "", false, stagecmd.BadInputf("task %q: environment/Dockerfile: step %q failed: %v; the end of buildah's log:\n%s\n(the whole log: %q)",
			s.task, failedStep(log.String()), err, logTail(log.String(), 30), logPath)
	}
	if _, err := b.buildahCmd(bctx, bs.dir, &log, "push", "--quiet", "--disable-compression", tag, "oci:"+link+":"+tagOf(s.image)); err != nil {
		return "", false, fmt.Errorf("task %q: buildah push: %w: %s", s.task, err, logTail(log.String(), 20))
	}
	_ = os.WriteFile(logPath, log.Bytes(), 0o644)
	os.RemoveAll(final)
	if err := os.Rename(tmp, final); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(filepath.Join(b.cache, key, "done"), []byte(s.image+"\n"), 0o644); err != nil {
		return "", false, err
	}
	return final, true, nil
}

// writeBase puts r's image into the build's layout p, named ref, with its
// layers uncompressed (named by their diff ids), as buildah pushes them:
// the push of the result then finds the base's layers in p and writes only
// the new ones. Layers stored uncompressed in an OCI layout source are
// hard-linked where the file system allows; compressed ones (a registry's)
// are decompressed once into shared (BUILD-CACHE/.bases), named by diff
// id, and hard-linked from there: every later build FROM the same
// base (a dataset's tasks share a few) neither decompresses it again (1.8 s
// of a 390 MB base, BenchmarkBuildHarbor with KILN_BENCH_BUILD_GZIP=1) nor
// stores another copy of it. A layer is decompressed into scratch (the
// build's own storage) and renamed into shared complete, so a build killed
// mid-way leaves no partial layer in shared, and its scratch file goes with
// its storage when the next build sweeps it (newStorage).
func writeBase(p, shared layout.Path, scratch string, r *resolved, ref string) error {
	m, err := r.img.Manifest()
	if err != nil {
		return err
	}
	cf, err := r.img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := r.img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != len(cf.RootFS.DiffIDs) || len(layers) != len(m.Layers) {
		return fmt.Errorf("%d layers, %d diff ids in its config", len(layers), len(cf.RootFS.DiffIDs))
	}
	man := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1}
	for i, l := range layers {
		diff := cf.RootFS.DiffIDs[i]
		blob := filepath.Join(string(p), "blobs", diff.Algorithm, diff.Hex)
		if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
			return err
		}
		if m.Layers[i].Digest == diff && r.layoutDir != "" {
			_ = os.Link(filepath.Join(r.layoutDir, "blobs", diff.Algorithm, diff.Hex), blob)
		}
		if _, err := os.Stat(blob); err != nil {
			one := filepath.Join(string(shared), "blobs", diff.Algorithm, diff.Hex)
			if _, err := os.Stat(one); err != nil {
				if err := decompressInto(one, scratch, l); err != nil {
					return err
				}
			}
			if err := os.Link(one, blob); err != nil {
				return err
			}
		}
		st, err := os.Stat(blob)
		if err != nil {
			return err
		}
		man.Layers = append(man.Layers, v1.Descriptor{MediaType: types.OCIUncompressedLayer, Size: st.Size(), Digest: diff})
	}
	cfg, err := r.img.RawConfigFile()
	if err != nil {
		return err
	}
	put := func(data []byte) (v1.Hash, error) {
		sum := sha256.Sum256(data)
		h := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
		return h, p.WriteBlob(h, io.NopCloser(bytes.NewReader(data)))
	}
	cfgDigest, err := put(cfg)
	if err != nil {
		return err
	}
	man.Config = v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(cfg)), Digest: cfgDigest}
	raw, err := json.Marshal(man)
	if err != nil {
		return err
	}
	manDigest, err := put(raw)
	if err != nil {
		return err
	}
	return p.AppendDescriptor(v1.Descriptor{MediaType: types.OCIManifestSchema1, Size: int64(len(raw)), Digest: manDigest,
		Annotations: map[string]string{refNameAnnotation: ref}})
}

// decompressInto writes l's uncompressed bytes to path by way of a
// temporary file in scratch (on path's file system), renamed into place
// complete: a build killed mid-write, or two writing at once, leave no torn
// blob under the name.
func decompressInto(path, scratch string, l v1.Layer) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.CreateTemp(scratch, "base-layer-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// buildStorage is one build's buildah storage, BUILD-CACHE/buildah/<random>,
// held by a flock on its .lock file while the build runs.
type buildStorage struct {
	dir    string
	unlock func()
}

// newStorage makes a build's own buildah storage; on the way it removes
// the storage of builds that died without removing theirs (a free lock).
func (b *builder) newStorage() (*buildStorage, error) {
	parent := filepath.Join(b.cache, "buildah")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(parent); err == nil {
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			stale := &buildStorage{dir: filepath.Join(parent, e.Name())}
			if unlock, ok := tryLock(stale.dir + ".lock"); ok {
				stale.unlock = unlock
				stale.remove(b)
			}
		}
	}
	// The lock first, the directory once it is held: a sweep by another
	// build only considers directories, so it never takes a new one.
	f, err := os.CreateTemp(parent, "s*.lock")
	if err != nil {
		return nil, err
	}
	f.Close()
	dir := strings.TrimSuffix(f.Name(), ".lock")
	unlock, ok := tryLock(f.Name())
	if !ok {
		return nil, fmt.Errorf("locking buildah storage %q: %w", dir, os.ErrExist)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		unlock()
		os.Remove(f.Name())
		return nil, err
	}
	return &buildStorage{dir: dir, unlock: unlock}, nil
}

// remove deletes the storage's images (which unmounts their layers), the
// storage and its lock.
func (s *buildStorage) remove(b *builder) {
	_, _ = b.buildahCmd(context.Background(), s.dir, io.Discard, "rmi", "--all", "--force")
	if err := removeTree(s.dir); err != nil {
		b.env.Log.Warn("removing a build's buildah storage failed", "dir", s.dir, "err", err)
	}
	os.Remove(s.dir + ".lock")
	s.unlock()
}

// buildahCmd runs buildah with the storage under store (buildStorage);
// its output goes to log, and stdout is returned too.
func (b *builder) buildahCmd(ctx context.Context, store string, log io.Writer, args ...string) (string, error) {
	full := append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "runroot"),
		"--storage-driver", b.driver}, args...)
	cmd := exec.CommandContext(ctx, b.buildah, full...)
	cmd.Env = append(os.Environ(), "BUILDAH_ISOLATION=chroot")
	// Both streams go to log, through one lock: exec copies them from two
	// goroutines.
	var stdout bytes.Buffer
	lw := &lockedWriter{w: log}
	cmd.Stdout = io.MultiWriter(&stdout, lw)
	cmd.Stderr = lw
	fmt.Fprintf(log, "$ buildah %s\n", strings.Join(args, " "))
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = fmt.Errorf("buildah %s: exit %d", args[0], ee.ExitCode())
	} else if err != nil {
		err = fmt.Errorf("running %q (install buildah: it is Debian's package): %w", b.buildah, err)
	}
	return stdout.String(), err
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

var (
	stepLine  = regexp.MustCompile(`(?m)^STEP \d+/\d+: (.*)$`)
	errorStep = regexp.MustCompile(`(?m)^Error: building at STEP "(.*)": `)
)

// failedStep is the step buildah names in its error, else the last step
// it started.
func failedStep(log string) string {
	if m := errorStep.FindAllStringSubmatch(log, -1); len(m) > 0 {
		return m[len(m)-1][1]
	}
	m := stepLine.FindAllStringSubmatch(log, -1)
	if len(m) == 0 {
		return "(before the first step)"
	}
	return m[len(m)-1][1]
}

func logTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func lastOutputLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
