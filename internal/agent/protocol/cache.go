package protocol

import (
	"encoding/json"
	"hash/maphash"
	"sync"

	"github.com/kilnrl/kiln/internal/ojson"
)

// Cache remembers the translations of the request parts a client resends
// unchanged on every turn of every session — Anthropic's system prompt and
// tool list (half of a Claude Code request's bytes), Responses' tool list —
// by a 128-bit
// fingerprint of their bytes (two maphashes under seeds drawn per Cache, so
// no client can aim a collision at it). A request whose part is cached skips
// parsing, translating and encoding that part: the bytes are those of a
// part already parsed and checked, and a translation is a function of them.
// Safe for concurrent use; a nil *Cache caches nothing.
type Cache struct {
	seeds [2]maphash.Seed

	mu      sync.Mutex
	entries map[cacheKey]any
}

// maxCacheEntries bounds a Cache: a run serves a handful of distinct system
// prompts and tool lists; past this many the cache starts over.
const maxCacheEntries = 256

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, entries: map[cacheKey]any{}}
}

type cacheKey struct {
	part string // what was translated, e.g. "anthropic.tools"
	n    int
	sum  [2]uint64
}

func (c *Cache) key(part string, raw []byte) cacheKey {
	return cacheKey{part: part, n: len(raw), sum: [2]uint64{maphash.Bytes(c.seeds[0], raw), maphash.Bytes(c.seeds[1], raw)}}
}

func (c *Cache) get(k cacheKey) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.entries[k]
	return v, ok
}

func (c *Cache) put(k cacheKey, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= maxCacheEntries {
		clear(c.entries)
	}
	c.entries[k] = v
}

// skippedValue stands for a value the parser skipped at its caller's word
// (a cached part, a History's messages).
type skippedValue struct{}

// cachedParts is one decode's use of a Cache: which top-level values the
// parser skipped because their translation is cached (hits), and the keys
// under which the others' translations are to be stored (misses).
type cachedParts struct {
	c      *Cache
	prefix string          // protocol, for the keys
	parts  map[string]bool // the top-level keys that may be cached
	hits   map[string]any
	misses map[string]cacheKey
}

func newCachedParts(c *Cache, prefix string, keys ...string) *cachedParts {
	if c == nil {
		return nil
	}
	cp := &cachedParts{c: c, prefix: prefix, parts: map[string]bool{}}
	for _, k := range keys {
		cp.parts[k] = true
	}
	return cp
}

// top is the parser's hook: a cached part's value is skipped.
func (cp *cachedParts) top(d *ojson.Decoder, key string) (any, bool, error) {
	if cp == nil || !cp.parts[key] {
		return nil, false, nil
	}
	// A repeated key: what counts is its last value (as the parser keeps).
	delete(cp.hits, key)
	delete(cp.misses, key)
	b, i := d.Data(), d.Offset()
	end := ojson.ValueEnd(b, i)
	if end < 0 {
		return nil, false, nil // the parser words the error
	}
	k := cp.c.key(cp.prefix+"."+key, b[i:end])
	if v, ok := cp.c.get(k); ok {
		if cp.hits == nil {
			cp.hits = map[string]any{}
		}
		cp.hits[key] = v
		d.Seek(end)
		return skippedValue{}, true, nil
	}
	if cp.misses == nil {
		cp.misses = map[string]cacheKey{}
	}
	cp.misses[key] = k
	return nil, false, nil
}

// hit returns the cached translation of key, if the parser skipped it.
func (cp *cachedParts) hit(key string) (any, bool) {
	if cp == nil {
		return nil, false
	}
	v, ok := cp.hits[key]
	return v, ok
}

// store caches the translation of key when it was looked up and missed.
func (cp *cachedParts) store(key string, v any) {
	if cp == nil {
		return
	}
	if k, ok := cp.misses[key]; ok {
		cp.c.put(k, v)
	}
}

// cachedTools is the cached translation of a tool list (Anthropic's,
// or Responses').
type cachedTools struct {
	tools []json.RawMessage
	specs []ToolSpec
}
