package dataset

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Ref names a dataset, and optionally one version of it: "name" means the
// version its latest pointer names, the one last made (see Resolve),
// "name@version" exactly that one.
type Ref struct {
	Name    string
	Version string // "" = latest
}

var (
	nameSegment = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	versionRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// ErrBadRef is wrapped by the errors of ParseRef: the text is not a
// dataset reference (a usage error where it came from the command line).
var ErrBadRef = errors.New("not a dataset reference")

// ParseRef parses "name" or "name@version".
func ParseRef(s string) (Ref, error) {
	name, version, pinned := strings.Cut(s, "@")
	r := Ref{Name: name, Version: version}
	if err := CheckName(name); err != nil {
		return Ref{}, fmt.Errorf("dataset reference %q: %w (%w: want name or name@version)", s, err, ErrBadRef)
	}
	if pinned && !versionRE.MatchString(version) {
		return Ref{}, fmt.Errorf("dataset reference %q: version must be letters, digits, '.', '_' or '-' (%w: want name or name@version)", s, ErrBadRef)
	}
	return r, nil
}

// CheckName validates a dataset name: slash-separated segments of letters,
// digits, '.', '_' and '-', each starting with a letter or digit (so the
// reserved "_v" directory can never be a dataset name).
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("empty dataset name")
	}
	for _, seg := range strings.Split(name, "/") {
		if !nameSegment.MatchString(seg) {
			return fmt.Errorf("dataset name %q: segment %q must start with a letter or digit and hold only letters, digits, '.', '_', '-'", name, seg)
		}
	}
	return nil
}

// Pinned reports whether the reference names an exact version.
func (r Ref) Pinned() bool { return r.Version != "" }

func (r Ref) String() string {
	if r.Version == "" {
		return r.Name
	}
	return r.Name + "@" + r.Version
}

// versionDir is the key prefix of one version (with trailing slash).
func versionDir(name, version string) string { return name + "/_v/" + version + "/" }

func manifestKey(name, version string) string { return versionDir(name, version) + "manifest.json" }

// attachmentsDir is the subdirectory of a version holding its attachments.
const attachmentsDir = "attachments/"

// AttachmentKey is the store key of the attachment rel (a relative,
// slash-separated path) of version r: a file a stage stores beside r's rows
// and names in them. It belongs to the version: kept once the version is
// committed, collected by GC if it never is. r must be pinned.
func AttachmentKey(r Ref, rel string) string {
	return versionDir(r.Name, r.Version) + attachmentsDir + strings.TrimPrefix(rel, "/")
}

// splitVersionKey parses a key inside a version directory.
func splitVersionKey(key string) (name, version, rest string, ok bool) {
	i := strings.Index(key, "/_v/")
	if i <= 0 {
		return "", "", "", false
	}
	name = key[:i]
	version, rest, ok = strings.Cut(key[i+len("/_v/"):], "/")
	if !ok || version == "" || CheckName(name) != nil {
		return "", "", "", false
	}
	return name, version, rest, true
}
