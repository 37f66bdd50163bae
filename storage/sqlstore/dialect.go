package sqlstore

import (
	"errors"
	"reflect"
	"strings"
)

// Dialect is the SQL of one database family: [MySQL] or [PostgreSQL]. A
// Dialect is used by value; only this package makes them.
type Dialect interface {
	// name is the dialect's name, for messages.
	name() string
	// maxIdent is the longest identifier (the database or schema part of
	// a table name) the server keeps as given.
	maxIdent() int
	// create returns what CreateTable runs, given the schema's text and
	// the quoted table.
	create(schema, quoted string) string
	// quote returns the table name, already checked, as an identifier.
	quote(table string) string
	// schema returns the CREATE TABLE text for the table (quoted) and
	// its bare name (for index names).
	schema(quoted, bare string) string
	// sql returns the statements for the quoted table.
	sql(quoted string) statements
	// classify tells what an error of the database means.
	classify(err error) errKind
}

// errKind is what an error of the database means to the store.
type errKind uint8

const (
	errOther     errKind = iota
	errDuplicate         // the key's row exists (INSERT)
	errLocked            // a locking read with NOWAIT found the row locked, or a lock wait ended
	errDeadlock          // the statement was chosen as a deadlock victim: try it again
	errTooLarge          // the statement exceeded the server's max_allowed_packet
)

// MySQL is the dialect of MySQL 8.0 and later and of MariaDB 10.6 and
// later, with InnoDB tables (see the package documentation). It needs
// FOR UPDATE NOWAIT and SKIP LOCKED (MySQL 8.0, MariaDB 10.6) and uses
// no statement that only one of the two has (no RETURNING, no SET
// STATEMENT). It recognizes the errors of github.com/go-sql-driver/mysql
// (and of any driver whose error is a struct with a uint16 field Number,
// the server's error code).
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

func (mysqlDialect) name() string { return "mysql" }

func (mysqlDialect) maxIdent() int { return 64 }

// create: CREATE TABLE IF NOT EXISTS is one statement, which MySQL runs
// safely from several sessions at once.
func (mysqlDialect) create(schema, _ string) string { return schema }

func (mysqlDialect) quote(table string) string {
	parts := strings.Split(table, ".")
	for i, p := range parts {
		parts[i] = "`" + p + "`"
	}
	return strings.Join(parts, ".")
}

// MySQL server error codes.
const (
	erDupEntry         = 1062
	erLockWaitTimeout  = 1205 // also MariaDB's answer to NOWAIT
	erLockDeadlock     = 1213
	erLockNowait       = 3572 // MySQL's answer to NOWAIT
	erNetPacketTooLarg = 1153
	erTooLongParam     = 1210 // a long-data parameter over max_allowed_packet (MariaDB: wrong arguments)
	erMaxAllowedPacket = 1301
)

func (mysqlDialect) classify(err error) errKind {
	n, ok := errNumber(err)
	if !ok {
		return errOther
	}
	switch n {
	case erDupEntry:
		return errDuplicate
	case erLockWaitTimeout, erLockNowait:
		return errLocked
	case erLockDeadlock:
		return errDeadlock
	case erNetPacketTooLarg, erMaxAllowedPacket:
		return errTooLarge
	}
	return errOther
}

// errNumber finds the server's error code in err's chain: a struct (or a
// pointer to one) with a uint16 field Number, as
// github.com/go-sql-driver/mysql's *MySQLError, read without importing
// the driver.
func errNumber(err error) (uint16, bool) {
	for e := err; e != nil; e = errors.Unwrap(e) {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				continue
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint()), true
		}
	}
	return 0, false
}
