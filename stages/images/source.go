package images

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Source kinds of a --source flag.
const (
	SourceOCI           = "oci"            // an OCI image layout directory
	SourceOCIArchive    = "oci-archive"    // a tar of an OCI image layout
	SourceDockerArchive = "docker-archive" // a `docker save` tarball
	SourceRegistry      = "registry"       // the default: pull from the registry
)

// refNameAnnotation tags a manifest in an OCI layout's index.json.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// Source maps images to a local source: Key is an exact image reference
// or a repository prefix (then the image is Key:TAG or Key@DIGEST and the
// tag selects the layout manifest whose ref.name annotation equals it).
type Source struct {
	Key  string
	Kind string
	Path string
}

func (s Source) String() string { return s.Key + "=" + s.Kind + ":" + s.Path }

// ParseSource parses KEY=KIND:PATH (KIND: oci, oci-archive, docker-archive).
func ParseSource(s string) (Source, error) {
	key, rest, ok := strings.Cut(s, "=")
	kind, p, ok2 := strings.Cut(rest, ":")
	if !ok || !ok2 || key == "" || p == "" {
		return Source{}, fmt.Errorf("--source %q: want REPOSITORY=oci:/layout/dir, REF=docker-archive:/file.tar or REF=oci-archive:/file.tar", s)
	}
	switch kind {
	case SourceOCI, SourceOCIArchive, SourceDockerArchive:
	default:
		return Source{}, fmt.Errorf("--source %q: unknown kind %q (want oci, oci-archive or docker-archive)", s, kind)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return Source{}, fmt.Errorf("--source %q: %w", s, err)
	}
	return Source{Key: key, Kind: kind, Path: abs}, nil
}

// resolved is an image whose manifest has been fetched and verified.
type resolved struct {
	image  string   // the reference as the tasks name it
	source string   // "registry" or KIND:PATH
	img    v1.Image // layers are read through it
	digest v1.Hash  // sha256 of the raw manifest
	// uncompressed: read layers uncompressed and check only their diff ids
	// (docker-archive, whose manifest go-containerregistry synthesizes).
	uncompressed bool
	// layoutDir is the OCI layout on disk whose blobs/ hold img's blobs
	// (oci: and unpacked oci-archive: sources), else "".
	layoutDir string
}

// resolver finds images in the configured sources; safe for concurrent use.
type resolver struct {
	sources []Source
	remote  []remote.Option
	tmpDir  string // where oci-archives are unpacked

	// have reports whether a complete bundle of a digest is in place: an
	// image pinned by digest (REPO@sha256:HEX) whose bundle exists needs
	// no source at all, so re-imports work offline.
	have func(v1.Hash) bool

	mu       sync.Mutex
	archives map[string]string // oci-archive path -> unpacked layout dir
}

func newResolver(sources []Source, tmpDir string, remoteOpts []remote.Option) *resolver {
	return &resolver{sources: sources, tmpDir: tmpDir, remote: remoteOpts, archives: map[string]string{}}
}

// close removes unpacked archives.
func (r *resolver) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.archives {
		os.RemoveAll(d)
	}
}

// match returns the source for image (the longest matching key) and the
// part after the key: "" (exact), ":TAG" or "@DIGEST".
func (r *resolver) match(image string) (Source, string, bool) {
	best, rest, found := Source{}, "", false
	for _, s := range r.sources {
		var tail string
		switch {
		case image == s.Key:
		case strings.HasPrefix(image, s.Key+":") || strings.HasPrefix(image, s.Key+"@"):
			tail = image[len(s.Key):]
		default:
			continue
		}
		if !found || len(s.Key) > len(best.Key) {
			best, rest, found = s, tail, true
		}
	}
	return best, rest, found
}

func (r *resolver) resolve(ctx context.Context, image string) (*resolved, error) {
	src, tail, ok := r.match(image)
	if _, d, pinned := strings.Cut(image, "@"); pinned && r.have != nil {
		if h, err := v1.NewHash(d); err == nil && r.have(h) {
			where := SourceRegistry
			if ok {
				where = src.Kind + ":" + src.Path
			}
			return &resolved{image: image, source: where, digest: h}, nil
		}
	}
	var res *resolved
	var expected *v1.Hash
	var err error
	switch {
	case !ok:
		res, expected, err = r.fromRegistry(ctx, image)
	case src.Kind == SourceDockerArchive:
		res, err = fromDockerArchive(image, src)
	default:
		dir := src.Path
		if src.Kind == SourceOCIArchive {
			if dir, err = r.unpackArchive(src.Path); err != nil {
				return nil, fmt.Errorf("image %q: %w", image, err)
			}
		}
		res, expected, err = fromLayout(image, src, dir, tail)
	}
	if err != nil {
		return nil, err
	}
	raw, err := res.img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("image %q from %s: manifest: %w", image, res.source, err)
	}
	sum := sha256.Sum256(raw)
	res.digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	if expected != nil && *expected != res.digest {
		return nil, stagecmd.BadInputf("image %q from %s: manifest digest is %s, the reference says %s: the source is corrupt", image, res.source, res.digest, expected)
	}
	return res, nil
}

func (r *resolver) fromRegistry(ctx context.Context, image string) (*resolved, *v1.Hash, error) {
	ref, err := name.ParseReference(image)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q is not a registry reference and no --source matches it: %w", image, err)
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})}, r.remote...)
	img, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: pull from registry %s: %w (credentials come from ~/.docker/config.json; use --source for local copies)", image, ref.Context().RegistryStr(), err)
	}
	var expected *v1.Hash
	if d, ok := ref.(name.Digest); ok {
		if h, err := v1.NewHash(d.DigestStr()); err == nil {
			if mt, err := img.MediaType(); err == nil && !mt.IsIndex() {
				expected = &h
			}
		}
	}
	return &resolved{image: image, source: SourceRegistry, img: img}, expected, nil
}

func fromDockerArchive(image string, src Source) (*resolved, error) {
	var tag *name.Tag
	if t, err := name.NewTag(image); err == nil && image != src.Key {
		tag = &t
	}
	img, err := tarball.ImageFromPath(src.Path, tag)
	if err != nil && tag != nil {
		img, err = tarball.ImageFromPath(src.Path, nil) // an archive of one image
	}
	if err != nil {
		return nil, fmt.Errorf("image %q: docker archive %q: %w", image, src.Path, err)
	}
	return &resolved{image: image, source: src.Kind + ":" + src.Path, img: img, uncompressed: true}, nil
}

// fromLayout finds image in an OCI layout: by digest for KEY@DIGEST, else
// the manifest whose ref.name is the tag (or the whole reference), else
// the only manifest when the key named the image exactly.
func fromLayout(image string, src Source, dir, tail string) (*resolved, *v1.Hash, error) {
	where := src.Kind + ":" + src.Path
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: OCI layout %q: %w", image, src.Path, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: OCI layout %q: index.json: %w", image, src.Path, err)
	}
	var pick *v1.Descriptor
	var names []string
	for i := range im.Manifests {
		d := &im.Manifests[i]
		ref := d.Annotations[refNameAnnotation]
		if ref != "" {
			names = append(names, ref)
		}
		switch {
		case strings.HasPrefix(tail, "@"):
			if "@"+d.Digest.String() == tail {
				pick = d
			}
		case strings.HasPrefix(tail, ":"):
			if ref == tail[1:] || ref == image {
				pick = d
			}
		case ref == image || ref == tagOf(image):
			pick = d
		}
	}
	if pick == nil && tail == "" && len(im.Manifests) == 1 {
		pick = &im.Manifests[0]
	}
	if pick == nil {
		sort.Strings(names)
		return nil, nil, fmt.Errorf("image %q: OCI layout %q has no manifest for it (its ref.name annotations: %s)", image, src.Path, strings.Join(names, ", "))
	}
	if pick.MediaType.IsIndex() {
		child, err := idx.ImageIndex(pick.Digest)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: OCI layout %q: %w", image, src.Path, err)
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: OCI layout %q: %w", image, src.Path, err)
		}
		var plat *v1.Descriptor
		for i := range cm.Manifests {
			if p := cm.Manifests[i].Platform; p != nil && p.OS == "linux" && p.Architecture == runtime.GOARCH {
				plat = &cm.Manifests[i]
				break
			}
		}
		if plat == nil {
			return nil, nil, fmt.Errorf("image %q: OCI layout %q: its index has no linux/%s manifest", image, src.Path, runtime.GOARCH)
		}
		img, err := child.Image(plat.Digest)
		if err != nil {
			return nil, nil, fmt.Errorf("image %q: OCI layout %q: %w", image, src.Path, err)
		}
		return &resolved{image: image, source: where, img: img, layoutDir: dir}, &plat.Digest, nil
	}
	img, err := idx.Image(pick.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("image %q: OCI layout %q: %w", image, src.Path, err)
	}
	return &resolved{image: image, source: where, img: img, layoutDir: dir}, &pick.Digest, nil
}

// unpackArchive extracts an oci-archive (a tar of a layout) once per run.
// Only the layout's own files are accepted: oci-layout, index.json and
// blobs/ALGO/HEX, as regular files and directories.
func (r *resolver) unpackArchive(archive string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.archives[archive]; ok {
		return d, nil
	}
	if err := os.MkdirAll(r.tmpDir, 0o755); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(r.tmpDir, ".oci-archive-*")
	if err != nil {
		return "", err
	}
	if err := extractLayoutTar(archive, dir); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("oci-archive %q: %w", archive, err)
	}
	r.archives[archive] = dir
	return dir, nil
}

func extractLayoutTar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p, err := cleanName(hdr.Name)
		if err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		parts := strings.Split(p, "/")
		okName := p == "oci-layout" || p == "index.json" || p == "blobs" || (parts[0] == "blobs" && len(parts) <= 3)
		switch {
		case p == "" || hdr.Typeflag == tar.TypeDir && okName:
			os.MkdirAll(filepath.Join(dir, p), 0o755)
		case (hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA) && okName && len(parts) != 2:
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(filepath.Join(dir, p), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("entry %q: %w", hdr.Name, err)
			}
		default:
			return stagecmd.BadInputf("entry %q (type %q) is not part of an OCI image layout", hdr.Name, hdr.Typeflag)
		}
	}
}

// tagOf is the tag of a reference: the text after the last ":" unless a
// "/" follows it (then it was a registry port), "" when there is none.
func tagOf(image string) string {
	image, _, _ = strings.Cut(image, "@")
	i := strings.LastIndexByte(image, ':')
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}
