package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/testenv"
)

// VersityVersion is the versitygw release scripts/install-test-deps.sh
// installs into $HOME/.cache/kiln/versitygw-<version>/versitygw.
const VersityVersion = "v1.8.0"

// VersityRegion is the region the test server and its clients use.
const VersityRegion = "us-east-1"

const (
	versityStartTimeout = 15 * time.Second
	versityStopTimeout  = 5 * time.Second
	installHint         = "run scripts/install-test-deps.sh to install versitygw " + VersityVersion +
		" into $HOME/.cache/kiln, or set KILN_VERSITYGW to a versitygw binary"
)

// Versity is a versitygw S3 server with a POSIX back end in a temporary
// directory, running for the duration of one test.
type Versity struct {
	Addr     string // 127.0.0.1:PORT
	Endpoint string // http://127.0.0.1:PORT
	Access   string
	Secret   string
	Region   string
	Version  string // of the binary, e.g. v1.8.0
	Binary   string
	Root     string // the POSIX back end's directory: one subdirectory per bucket
	Sidecar  bool   // metadata in a sidecar directory: the filesystem lacks user xattrs

	admin *minio.Client
}

var (
	versityMu      sync.Mutex
	versityServers = map[testing.TB]*Versity{}
	versityVersion sync.Map // binary path -> version string
	bucketSeq      atomic.Int64
)

// VersityServer returns the versitygw server of t, starting it on the first
// call for t; later calls with the same t (from StartVersity, VersityEnv or
// the test itself) share it. The server is stopped when t ends. Starting one
// takes about 50 ms, so every test gets its own; subtests that want to share
// one should use the *Versity of their parent.
//
// Metadata goes in user xattrs, or in a --sidecar directory where the
// filesystem lacks them or KILN_VERSITYGW_SIDECAR=1. If no versitygw binary
// is found, the test is skipped, or fails when the environment has CI=true.
func VersityServer(t testing.TB) *Versity {
	t.Helper()
	versityMu.Lock()
	defer versityMu.Unlock()
	if v := versityServers[t]; v != nil {
		return v
	}
	v := startVersity(t)
	versityServers[t] = v
	t.Cleanup(func() {
		versityMu.Lock()
		delete(versityServers, t)
		versityMu.Unlock()
	})
	return v
}

// StartVersity returns a store.S3 at s3://<fresh bucket>/store on t's
// versitygw server (see VersityServer).
func StartVersity(t testing.TB) *store.S3 {
	t.Helper()
	v := VersityServer(t)
	return v.Open(t, "s3://"+v.NewBucket(t)+"/store")
}

// VersityEnv returns t's versitygw server's endpoint, the environment a child
// process needs to reach it through store.Open (append env to os.Environ():
// later entries win), and the URI of a fresh bucket, s3://<bucket>/data. Each
// call returns a new bucket on the same server.
func VersityEnv(t testing.TB) (endpoint string, env []string, uri string) {
	t.Helper()
	v := VersityServer(t)
	return v.Endpoint, v.Env(), "s3://" + v.NewBucket(t) + "/data"
}

// Env is the environment store.Open (store.S3OptionsFromEnv and the default
// credential chain) needs to reach v, overriding whatever AWS settings the
// test's own environment has.
func (v *Versity) Env() []string {
	return []string{
		"KILN_S3_ENDPOINT=" + v.Endpoint,
		"AWS_ENDPOINT_URL_S3=" + v.Endpoint,
		"AWS_ENDPOINT_URL=" + v.Endpoint,
		"AWS_ACCESS_KEY_ID=" + v.Access,
		"AWS_SECRET_ACCESS_KEY=" + v.Secret,
		"AWS_SESSION_TOKEN=",
		"AWS_REGION=" + v.Region,
		"AWS_DEFAULT_REGION=" + v.Region,
		"AWS_CA_BUNDLE=",
	}
}

// Environ is os.Environ() with Env appended, for exec.Cmd.Env.
func (v *Versity) Environ() []string { return append(os.Environ(), v.Env()...) }

// Options are the store.S3Options that reach v.
func (v *Versity) Options() store.S3Options {
	return store.S3Options{
		Endpoint: v.Endpoint,
		Region:   v.Region,
		Creds:    credentials.NewStaticV4(v.Access, v.Secret, ""),
	}
}

// Open returns a store.S3 for uri (s3://bucket/prefix) on v. The bucket must
// exist (see NewBucket).
func (v *Versity) Open(t testing.TB, uri string) *store.S3 {
	t.Helper()
	s, err := store.NewS3(uri, v.Options())
	if err != nil {
		t.Fatalf("store.NewS3(%q): %v", uri, err)
	}
	return s
}

// NewBucket creates a bucket with a name no other call returns and returns
// the name.
func (v *Versity) NewBucket(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("kiln-test-%d-%s", bucketSeq.Add(1), randomHex(4))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.admin.MakeBucket(ctx, name, minio.MakeBucketOptions{Region: v.Region}); err != nil {
		t.Fatalf("versitygw at %s: creating bucket %q: %v", v.Addr, name, err)
	}
	return name
}

// findVersity returns the versitygw binary, or skips or fails t.
func findVersity(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("KILN_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("KILN_VERSITYGW=%s: %v (%s)", p, err, installHint)
		}
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "kiln", "versitygw-"+VersityVersion, "versitygw")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	testenv.SkipOrFail(t, "versitygw not found, so the S3 back end cannot be tested: %s", installHint)
	return ""
}

var (
	versionInPath   = regexp.MustCompile(`versitygw-(v[0-9]+\.[0-9]+\.[0-9]+[^/]*)/`)
	versionInOutput = regexp.MustCompile(`(?m)^Version\s*:\s*(\S+)`)
)

// binaryVersion reads the version from the install path (the version flag
// of a binary built without release flags says "git"), else from
// versitygw --version.
func binaryVersion(bin string) string {
	if v, ok := versityVersion.Load(bin); ok {
		return v.(string)
	}
	ver := "(unknown version)"
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		real = bin
	}
	if m := versionInPath.FindStringSubmatch(filepath.ToSlash(bin)); m != nil {
		ver = m[1]
	} else if m := versionInPath.FindStringSubmatch(filepath.ToSlash(real)); m != nil {
		ver = m[1]
	} else if out, err := exec.Command(bin, "--version").CombinedOutput(); err == nil {
		if m := versionInOutput.FindSubmatch(out); m != nil && string(m[1]) != "git" {
			ver = string(m[1])
		}
	}
	versityVersion.Store(bin, ver)
	return ver
}

func startVersity(t testing.TB) *Versity {
	t.Helper()
	bin := findVersity(t)
	root := t.TempDir()
	var sidecar string
	if os.Getenv("KILN_VERSITYGW_SIDECAR") == "1" || !userXattrs(root) {
		sidecar = t.TempDir()
	}
	v := &Versity{
		Access: "kiln" + randomHex(8), Secret: randomHex(20), Region: VersityRegion,
		Version: binaryVersion(bin), Binary: bin, Root: root, Sidecar: sidecar != "",
	}
	var err error
	for attempt := 0; ; attempt++ {
		err = v.launch(t, sidecar)
		if err == nil {
			break
		}
		// Another process may take the free port between our probe and
		// versitygw's listen: try another.
		if attempt < 3 && strings.Contains(err.Error(), "address already in use") {
			continue
		}
		t.Fatalf("starting versitygw: %v", err)
	}
	admin, err := store.NewS3("s3://admin", v.Options())
	if err != nil {
		t.Fatalf("versitygw client: %v", err)
	}
	v.admin = admin.Client()
	t.Logf("versitygw %s at %s (sidecar=%v)", v.Version, v.Addr, v.Sidecar)
	return v
}

// launch starts the server on a free port and waits until it answers HTTP.
func (v *Versity) launch(t testing.TB, sidecar string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	args := []string{"--access", v.Access, "--secret", v.Secret, "--region", v.Region, "--port", addr, "--quiet", "posix"}
	if sidecar != "" {
		args = append(args, "--sidecar", sidecar)
	}
	args = append(args, v.Root)
	cmd := exec.Command(v.Binary, args...)
	cmd.Env = versityEnviron()
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", v.Binary, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	stop := func() {
		select {
		case <-exited:
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(versityStopTimeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(versityStartTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s %s exited before answering on %s: %v\noutput:\n%s", v.Binary, strings.Join(redact(args, v.Secret), " "), addr, waitErr, out)
		default:
		}
		if resp, err := hc.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			break // any HTTP answer (403 without credentials) will do
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("%s did not answer on %s within %v\noutput:\n%s", v.Binary, addr, versityStartTimeout, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() && out.Len() > 0 {
			t.Logf("versitygw output:\n%s", out)
		}
	})
	v.Addr, v.Endpoint = addr, "http://"+addr
	if testing.Verbose() {
		t.Logf("versitygw answered after %v", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// versityEnviron is the test's environment without versitygw's own settings,
// which would override the command line.
func versityEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VGW_") || strings.HasPrefix(kv, "ROOT_ACCESS_KEY") || strings.HasPrefix(kv, "ROOT_SECRET") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func redact(args []string, secret string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == secret {
			a = "<secret>"
		}
		out[i] = a
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// syncBuffer collects a child's output from two goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
