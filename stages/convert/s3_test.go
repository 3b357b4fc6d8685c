package convert_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/formats/store/storetest"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestMiMoFromS3: --data may be an s3:// prefix; the objects' ETags and
// sizes enter the version id, so a changed object is a new version.
func TestMiMoFromS3(t *testing.T) {
	v := storetest.VersityServer(t)
	for _, kv := range v.Env() {
		k, val, _ := strings.Cut(kv, "=")
		t.Setenv(k, val)
	}
	bucket := v.NewBucket(t)
	src := v.Open(t, "s3://"+bucket)
	local := writeMiMo(t, []any{basic("A"), basic("B")}, mappingLine("A")+mappingLine("B"))
	put := func(name string, data []byte) {
		_, err := src.Put(context.Background(), "mimo/"+name, strings.NewReader(string(data)), int64(len(data)))
		require.NoError(t, err)
	}
	for _, name := range []string{"code.parquet", "image-mapping.jsonl"} {
		data, err := os.ReadFile(filepath.Join(local, name))
		require.NoError(t, err)
		put(name, data)
	}
	storeDir := t.TempDir()
	uri := "s3://" + bucket + "/mimo/"
	first := run(t, "mimo", "--store", storeDir, "--data", uri, "--out", "tasks/s3")
	require.Equal(t, 0, first.Code, first.Stderr)
	localRun := run(t, "mimo", "--store", storeDir, "--data", local, "--out", "tasks/local")
	require.Equal(t, 0, localRun.Code, localRun.Stderr)
	assert.Equal(t, export(t, storeDir, localRun.LastLine()), export(t, storeDir, first.LastLine()))

	again := run(t, "mimo", "--store", storeDir, "--data", uri, "--out", "tasks/s3")
	assert.Equal(t, first.LastLine(), again.LastLine())
	put("image-mapping.jsonl", []byte(mappingLine("A")+mappingLine("B")+mappingLine("C")))
	changed := run(t, "mimo", "--store", storeDir, "--data", uri, "--out", "tasks/s3")
	require.Equal(t, 0, changed.Code, changed.Stderr)
	assert.NotEqual(t, first.LastLine(), changed.LastLine(), "a changed object is a new version")

	missing := run(t, "mimo", "--store", storeDir, "--data", "s3://"+bucket+"/nope", "--out", "tasks/s3")
	assert.Equal(t, stagecmd.ExitNotFound, missing.Code, missing.Stderr)
}
