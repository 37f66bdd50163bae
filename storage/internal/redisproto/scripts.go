// Package redisproto is the protocol that idem's Redis stores speak: the
// commands and Lua scripts, the layout of an entry, the parsing of the
// answers, the cursor of a listing and the guard against a server that
// may evict or is too old. It depends on no Redis client: each store
// module (storage/redisstore on go-redis, storage/rueidisstore on rueidis)
// is a thin transport that sends the commands through its client and
// hands the answers back here, so both stores read and write the very
// same entries and give the very same answers, and a service may move
// from one to the other (or run both during a deploy) without a
// rolling-deploy hazard.
//
// The package is internal to the storage tree. The store modules require
// the core module at the version they were released with; its API only
// grows (nothing here changes its meaning), so that a store module keeps
// building against a newer core.
//
// # Layout
//
// An entry is one Redis string under prefix+key: a stamp, then the entry:
//
//	'T' since                                                 the stamp
//	'P' len(fingerprint) fingerprint owner                    while processing
//	'Q' len(fingerprint) fingerprint len(ttl) ttl owner       while processing, taken from an issue
//	'C' len(fingerprint) fingerprint len(owner) owner record  when done
//	'I' ttl                                                   when issued
//	'D' len(fingerprint) fingerprint record                   when done, written by an older release, unstamped
//
// The stamp holds when the entry entered its state, by the clock of the
// instance that wrote it (releases before the Acquire was a SET NX GET
// stamped by the server's TIME; the bytes are the same): since is the
// Unix time in milliseconds, in 6 bytes, most significant first (7 bytes
// in all). The state is one byte; the fingerprint's length is one byte;
// ttl is decimal digits without a leading zero (at most 15), after its
// length in one byte in a 'Q' entry; len(owner) in a 'C' entry is an
// unsigned varint of at most 5 bytes, never 0. The store packages'
// documentation says what each state means to a caller.
//
// # Commands
//
// Redis is single-threaded and shared by every instance of every service
// that uses it, so its time per request is what caps a fleet; the
// protocol spends as little of it as an atomic answer allows (measured
// with INFO commandstats: an EVALSHA of a script costs several times a
// SET, before the commands it calls; the stores' BenchmarkCommandTime
// measures it beside the naive floor):
//
//   - Acquire is one native command, SET key value NX PX lease GET (Redis
//     7.0 and newer: 6.2 refuses NX with GET), whose value is a new 'P'
//     entry ([AppendProcessing]): it makes the entry, or leaves the one
//     there and answers it, which [SetResult] reads. A new key and a
//     replay (a done entry) cost that one command. Another owner's entry
//     costs a PTTL more, for its lease left (the entry may have gone
//     between the two: the lease left is then 1 ms, and the caller
//     retries). An issued entry must be taken atomically, and the owner's
//     own entry (a resent Acquire) renewed: the Acquire script does
//     either, or whatever the entry then calls for, as it did alone
//     before.
//   - AcquireIssued and Issue stay scripts: neither may create an entry
//     that the other does not expect. Complete and Extend are one plain
//     SET ... IFEQ on a server that has it (the native path, native.go);
//     elsewhere, and where that command cannot decide, they and Release
//     stay scripts, as comparing the owner and writing must be atomic, but
//     lean: the owner's own 'P' entry (every Complete of a first
//     execution) is read at fixed offsets, without defining the parsing
//     functions (a function defined in a script costs a closure each run),
//     and the done entry is written in one concatenation (measured: SET of
//     the header then APPEND of a 512-byte record costs more than the
//     concatenation). No script calls TIME: the writer passes its stamp.
//   - The stamp is the writer's clock, not the server's: a fleet's clocks
//     agree within far less than what Since is for (an operator's
//     question "how old is this entry"), and TIME cost each writing script
//     a command. Inspect still reads TIME for the Expires it shows.
//   - The Redis version is checked once with the eviction policy (the
//     same INFO), and every operation that starts new work is refused with
//     [ErrRedisVersion] on a server older than 7.0.
//
// Old and new releases read each other's entries both ways (the layout
// did not change), so a rolling deploy needs no migration. An older
// release's scripts are other scripts (other digests): both are cached
// side by side.
package redisproto

import (
	"crypto/sha1"
	"encoding/hex"
	"time"
)

// Script is a Lua script and its SHA-1 digest, the name EVALSHA calls it
// by. Every script touches KEYS[1] only, so it routes to the key's node of
// a Redis Cluster, and gives the same answer when run twice, but Issue's,
// whose second run answers that the key exists.
type Script struct {
	Src string // the source, sent by EVAL
	SHA string // hex SHA-1 of Src, sent by EVALSHA
}

func newScript(src string) Script {
	sum := sha1.Sum([]byte(src))
	return Script{Src: src, SHA: hex.EncodeToString(sum[:])}
}

// The scripts. Their arguments (ARGV) in order; stamp is the writer's
// time, the 6 bytes of [AppendStamp]:
var (
	// Acquire: owner, fingerprint, lease in ms, stamp. Answers as
	// [AcquireResult] reads. The stores send it only where [SetResult]
	// says so (an issued entry, or the caller's own processing one): the
	// SET NX GET of [AppendProcessing] does the rest.
	Acquire = newScript(acquireSrc)
	// AcquireIssued: owner, fingerprint, lease in ms, stamp. Answers as
	// [AcquireIssuedResult] reads.
	AcquireIssued = newScript(acquireIssuedSrc)
	// Issue: TTL in ms, stamp. Answers as [IssueResult] reads.
	Issue = newScript(issueSrc)
	// Complete: owner, record, TTL in ms, stamp, the owner's length as
	// [AppendUvarint] writes it. Answers as [OwnedResult] reads.
	Complete = newScript(completeSrc)
	// Release: owner, stamp. Answers as [OwnedResult] reads.
	Release = newScript(releaseSrc)
	// Extend: owner, lease in ms. Answers as [OwnedResult] reads.
	Extend = newScript(extendSrc)
	// Inspect: one of [InspectLookup], [InspectWithRecord] or
	// [InspectRemove], then for InspectRemove the version to remove.
	// Answers as [EntryOf] reads.
	Inspect = newScript(inspectSrc)
)

// The modes of the Inspect script.
const (
	InspectLookup     = "0"
	InspectWithRecord = "1"
	InspectRemove     = "2"
)

// Millis gives d in whole milliseconds, rounded up, for a d > 0: never 0,
// which PEXPIRE takes as "delete now" and SET PX refuses. It is the form
// of every lease and TTL the scripts take.
func Millis(d time.Duration) int64 {
	n := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		n++
	}
	return n
}

// getLua, the start of every script, reads the value with PCALL, so
// that a key of another type (a hash, a list: GET answers WRONGTYPE)
// reads as the empty string, which is not an entry: every script answers
// "not an entry" for it rather than failing.
const getLua = `
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then v = '' end
`

// parseLua defines the functions that read a value; a script runs it
// only off its fast path (Complete's and Extend's own processing entry),
// since defining a function costs the server a closure each time the
// script runs. parse splits a value into its state, fingerprint, rest
// (owner or record), issue TTL, done entry's owner and stamp, or returns
// nil when the value is not an entry (a processing entry must have an
// owner, and so must a 'C' entry). A 'P' entry and a 'Q' entry (taken
// from an issue) both come out as 'P', the 'Q' one with its issue TTL,
// the others without; a 'C' entry and a 'D' entry (the previous
// release's, without the owner) both come out as 'D', with the record as
// rest, the 'C' one with its owner, the 'D' one without; an 'I' entry
// comes out with empty fingerprint and rest. A TTL is a string of 1 to 15
// decimal digits without a leading zero, kept as a string to be sent to
// PX as it is. uvarint reads the unsigned varint (7 bits a byte, least
// significant first, as Go's encoding/binary) of at most 5 bytes at i of
// s, and returns it and the index after it.
const parseLua = `
local function ttl(t)
  if #t <= 15 and string.find(t, '^[1-9][0-9]*$') then return t end
  return nil
end
local function uvarint(s, i)
  local x, mul = 0, 1
  for j = i, i + 4 do
    local b = string.byte(s, j)
    if b == nil then return nil end
    if b < 128 then return x + b * mul, j + 1 end
    x, mul = x + (b - 128) * mul, mul * 128
  end
  return nil
end
local function parse(v)
  local b, since = 1, nil
  if string.sub(v, 1, 1) == 'T' then
    if #v < 8 then return nil end
    since, b = string.sub(v, 2, 7), 8
  end
  local tag = string.sub(v, b, b)
  if tag == 'I' then
    local t = ttl(string.sub(v, b + 1))
    if t then return 'I', '', '', t, nil, since end
    return nil
  end
  local n = string.byte(v, b + 1)
  if n == nil or #v < b + 1 + n then return nil end
  local fp, rest = string.sub(v, b + 2, b + 1 + n), string.sub(v, b + 2 + n)
  if tag == 'C' then
    local m, i = uvarint(rest, 1)
    if m == nil or m == 0 or #rest < i - 1 + m then return nil end
    return 'D', fp, string.sub(rest, i + m), nil, string.sub(rest, i, i - 1 + m), since
  elseif tag == 'D' and not since then
    return 'D', fp, rest
  elseif tag == 'P' and #rest > 0 then
    return 'P', fp, rest, nil, nil, since
  elseif tag == 'Q' then
    local m = string.byte(rest, 1)
    if m == nil or #rest < 2 + m then return nil end
    local t = ttl(string.sub(rest, 2, 1 + m))
    if t then return 'P', fp, string.sub(rest, 2 + m), t, nil, since end
  end
  return nil
end
`

// ownLua, the fast path of the owner-checked scripts, finds the start b
// of the entry (after its stamp, if any) and, when it is a 'P' entry of
// ARGV[1], the length n of its fingerprint; mine is false otherwise, and
// the script goes on to parse the value. It reads fixed offsets only: a
// 'P' entry is its tag, the fingerprint's length and the fingerprint,
// then the owner to its end.
const ownLua = `
local b, n, mine = 1, 0, false
if string.byte(v, 1) == 84 and #v >= 8 then b = 8 end
if string.byte(v, b) == 80 then
  n = string.byte(v, b + 1)
  mine = n ~= nil and string.sub(v, b + 2 + n) == ARGV[1]
end
`

// Answers of the scripts. Acquire answers 1 (acquired), the done entry's
// whole value (a string, parsed by [doneResult]: one bulk string costs a
// client fewer allocations than a table), {2, fingerprint, pttl} (in
// flight) or 0 (corrupt); AcquireIssued the same, or 3 (not issued). The
// others answer one integer.
const (
	codeCorrupt  = -1
	codeNotOwner = 0
	codeOK       = 1
	codeExists   = 0 // Issue's answer when the key has an entry

	codeAcquireCorrupt = 0
	codeAcquired       = 1
	codeInFlight       = 2
	codeNotIssued      = 3
)

// takeLua, the rest of the acquire scripts once parseLua found an entry:
// an issued entry is taken, becoming a 'Q' entry that keeps the issue's
// TTL. ARGV owner, fingerprint, lease in ms, stamp.
const takeLua = parseLua + `
local tag, fp, rest, t = parse(v)
if tag == 'I' then
  redis.call('SET', KEYS[1], 'T' .. ARGV[4] .. 'Q' .. string.char(#ARGV[2]) .. ARGV[2] .. string.char(#t) .. t .. ARGV[1], 'PX', ARGV[3])
  return 1
elseif tag == 'D' then
  return v
elseif tag == 'P' and rest == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
elseif tag == 'P' then
  return {2, fp, redis.call('PTTL', KEYS[1])}
end
return 0
`

// acquire: ARGV owner, fingerprint, lease in ms, stamp.
const acquireSrc = getLua + `
if not v then
  redis.call('SET', KEYS[1], 'T' .. ARGV[4] .. 'P' .. string.char(#ARGV[2]) .. ARGV[2] .. ARGV[1], 'PX', ARGV[3])
  return 1
end
` + takeLua

// acquireIssued: ARGV owner, fingerprint, lease in ms, stamp. No entry:
// not issued, and nothing is written.
const acquireIssuedSrc = getLua + `
if not v then return 3 end
` + takeLua

// issue: ARGV ttl in ms, stamp. An entry in any state: 0, nothing
// written.
const issueSrc = getLua + `
if not v then
  redis.call('SET', KEYS[1], 'T' .. ARGV[2] .. 'I' .. ARGV[1], 'PX', ARGV[1])
  return 1
end
` + parseLua + `
if parse(v) then return 0 end
return -1
`

// complete: ARGV owner, record, ttl in ms, stamp, uvarint(#owner). Its
// fast path, the caller's own 'P' entry, writes the done entry in one
// concatenation. A done entry: 1 (a resend) when it was completed by
// this owner with this record; 0 otherwise, and always for a 'D' entry,
// which does not tell its owner.
const completeSrc = getLua + `
if not v then return 0 end
` + ownLua + `
if mine then
  redis.call('SET', KEYS[1], 'T' .. ARGV[4] .. 'C' .. string.sub(v, b + 1, b + 1 + n) .. ARGV[5] .. ARGV[1] .. ARGV[2], 'PX', ARGV[3])
  return 1
end
` + parseLua + `
local tag, fp, rest, t, o = parse(v)
if tag == 'D' then
  if o == ARGV[1] and rest == ARGV[2] then return 1 end
  return 0
elseif tag == 'P' then
  if rest ~= ARGV[1] then return 0 end
  redis.call('SET', KEYS[1], 'T' .. ARGV[4] .. 'C' .. string.char(#fp) .. fp .. ARGV[5] .. ARGV[1] .. ARGV[2], 'PX', ARGV[3])
  return 1
elseif tag == 'I' then
  return 0
end
return -1
`

// release: ARGV owner, stamp. An entry taken from an issue goes back to
// issued, for the issue's TTL; an issued entry is left alone (a resend).
const releaseSrc = getLua + `
if not v then return 1 end
` + ownLua + `
if mine then
  redis.call('DEL', KEYS[1])
  return 1
end
` + parseLua + `
local tag, fp, rest, t = parse(v)
if tag == 'P' and rest == ARGV[1] then
  if t then
    redis.call('SET', KEYS[1], 'T' .. ARGV[2] .. 'I' .. t, 'PX', t)
  else
    redis.call('DEL', KEYS[1])
  end
  return 1
elseif tag == 'I' then
  return 1
elseif tag then
  return 0
end
return -1
`

// extend: ARGV owner, lease in ms.
const extendSrc = getLua + `
if not v then return 0 end
` + ownLua + `
if mine then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
` + parseLua + `
local tag, fp, rest = parse(v)
if tag == 'P' and rest == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif tag then
  return 0
end
return -1
`

// inspectSrc: ARGV[1] "0" (look up), "1" (look up with the record) or
// "2" (remove, if the entry's version is ARGV[2]). No entry: 0; not an
// entry (a key of another type included: getLua reads it as an empty
// string): -1; otherwise {state, fingerprint, since, pttl, the server's
// seconds, microseconds, the record's size, the record or "", the
// version, removed}, where removed is 1 when "2" deleted the key, 2 when
// it did not because the version differs, 0 for a look up.
//
// The version is the first 16 hex digits of the SHA-1 of what names the
// entry's incarnation: its state, stamp, fingerprint, owner (in flight,
// or completed by) and issue TTL. A renewal (PEXPIRE) changes none of
// them; every other write restamps the entry or changes its owner. The
// record is left out (hashing a megabyte per entry of a listing would
// hold the server), but for the unstamped 'D' entries, which only the
// record's size tells apart.
var inspectSrc = getLua + parseLua + `
if not v then return 0 end
local tag, fp, rest, t, o, since = parse(v)
if not tag then return -1 end
local now = redis.call('TIME')
local size, rec, who = 0, '', ''
if tag == 'D' then
  size = #rest
  if ARGV[1] == '1' then rec = rest end
  who = o or tostring(size)
elseif tag == 'P' then
  who = rest
end
local version = string.sub(redis.sha1hex(tag .. '\0' .. (since or '') .. '\0' .. fp .. '\0' .. who .. '\0' .. (t or '')), 1, 16)
local pttl = redis.call('PTTL', KEYS[1])
local removed = 0
if ARGV[1] == '2' then
  if ARGV[2] == version then
    redis.call('DEL', KEYS[1])
    removed = 1
  else
    removed = 2
  end
end
return {tag, fp, since or '', pttl, now[1], now[2], size, rec, version, removed}
`
