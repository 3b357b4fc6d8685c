package store

import (
	"fmt"
	"os"
	"strings"
)

// DefaultURI is the store used when neither --store nor KILN_STORE is set.
const DefaultURI = "./data"

// Open returns the store a URI names: s3://bucket/prefix, file:///abs/dir,
// or a plain directory path. S3 settings come from the environment (see
// S3OptionsFromEnv).
func Open(uri string) (Store, error) {
	switch {
	case uri == "":
		return nil, fmt.Errorf("empty store URI: pass --store or set KILN_STORE")
	case strings.HasPrefix(uri, "s3://"):
		return NewS3(uri, S3OptionsFromEnv())
	case strings.HasPrefix(uri, "file://"):
		return NewLocal(strings.TrimPrefix(uri, "file://"))
	case strings.Contains(uri, "://"):
		return nil, fmt.Errorf("store %q: unknown scheme (want a directory, file:// or s3://)", uri)
	case strings.HasPrefix(uri, "s3:") || strings.HasPrefix(uri, "file:"):
		return nil, fmt.Errorf("store %q: malformed URI (want s3://bucket/prefix or file:///dir)", uri)
	}
	return NewLocal(uri)
}

// URIFromEnv is KILN_STORE, or DefaultURI.
func URIFromEnv() string {
	if v := os.Getenv("KILN_STORE"); v != "" {
		return v
	}
	return DefaultURI
}
