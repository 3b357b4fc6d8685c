package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// TestDocExamples parses every kiln command line in the fenced code blocks
// of every README.md and docs/*.md with the binary's own flags, as
// TestHelpExamples does for the --help texts: each names commands and
// flags that exist, takes values of the flags' types, and gives every
// required flag. A line may elide with "..." (then only the required flags
// may be missing) and mark an optional word with [brackets]. The make
// example of pipelines/README.md is pipelines/readmecheck's.
func TestDocExamples(t *testing.T) {
	root := "../.."
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		rel, _ := filepath.Rel(root, path)
		if d.Name() == "README.md" || filepath.Dir(rel) == "docs" && strings.HasSuffix(rel, ".md") {
			files = append(files, rel)
		}
		return nil
	})
	require.NoError(t, err)
	n := 0
	for _, rel := range files {
		src, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err)
		for _, ex := range docExamples(string(src)) {
			n++
			t.Run(rel+": "+ex, func(t *testing.T) {
				elided := strings.Contains(ex, "...")
				var words []string
				for _, w := range shellWords(ex) {
					if w != "..." {
						words = append(words, strings.Trim(w, "[]"))
					}
				}
				binary := words[0]
				if _, ok := binaries["kiln-"+words[1]]; binary == "kiln" && ok {
					binary, words = "kiln-"+words[1], words[1:]
				}
				if _, ok := binaries[binary]; !ok {
					t.Fatalf("%s is not a kiln binary", binary)
				}
				var got parsed
				app, _ := recordingApp(binary, &got)
				var errb bytes.Buffer
				code := stagecmd.Main(app, append([]string{binary}, words[1:]...), &errb)
				if code != 0 && elided && strings.Contains(errb.String(), "missing required flag") {
					return
				}
				assert.Equal(t, 0, code, "%s", errb.String())
			})
		}
	}
	assert.Greater(t, n, 40, "command lines found in %d files", len(files))
}

var (
	fence      = regexp.MustCompile("^```([a-z]*)")
	docCommand = regexp.MustCompile(`^(\$ )?(kiln(-[a-z]+)? .*)$`)
)

// docExamples returns the kiln command lines of a Markdown text's fenced
// code blocks (not ```make ones: pipeline recipes), a "$ " prompt, a
// trailing "# comment" and continuation backslashes taken off; lines that
// pipe or substitute commands are left out.
func docExamples(md string) []string {
	var out []string
	in, lang := false, ""
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if m := fence.FindStringSubmatch(l); m != nil {
			in, lang = !in, m[1]
			continue
		}
		m := docCommand.FindStringSubmatch(l)
		if !in || lang == "make" || m == nil {
			continue
		}
		l = m[2]
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) {
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if c := strings.Index(l, " #"); c >= 0 {
			l = strings.TrimSpace(l[:c])
		}
		if !isPipeline(l) {
			out = append(out, l)
		}
	}
	return out
}
