// Package dynamostore is a [storage.Store] on an Amazon DynamoDB table,
// shared by every instance of a service: for services on AWS (Lambda
// behind API Gateway, ECS, EKS) that keep their state in DynamoDB and run
// no Redis or PostgreSQL. It is also an [storage.Issuer] and an
// [storage.Inspector].
//
//	cfg, err := config.LoadDefaultConfig(ctx) // the default credential chain and region
//	store, err := dynamostore.New(dynamodb.NewFromConfig(cfg), dynamostore.WithTable("orders_idem"))
//	if err := store.Ping(ctx); err != nil { // a missing table or a wrong region, said at startup
//		log.Fatal(err)
//	}
//	m, err := idem.New(store)
//
// # Table
//
// One item an entry, under its key, in a table of the service's own:
//
//   - partition key id, a string (S); no sort key, no index;
//   - on-demand capacity (PAY_PER_REQUEST), or provisioned capacity sized
//     for two writes a first execution and one read or write a replay;
//   - DynamoDB's TTL on the attribute ttl (Unix seconds), which deletes
//     expired items in the background, within days. The store never
//     relies on it: every condition and every read treats an item whose
//     expires_ms has passed as absent. TTL only frees the space.
//
// The other attributes: state (processing, done or issued), owner and
// fingerprint (binary), record or record_z (a done entry's record, as
// given or compressed), size (its length), expires_ms (the end of the
// lease or of the TTL, Unix ms), since_ms (when the entry entered its
// state) and issue_ttl_ms (the TTL of the issue a processing entry was
// taken from).
//
// [Store.CreateTable] creates such a table, for tests and quick starts. In
// production it belongs to the infrastructure's code. CloudFormation:
//
//	IdemTable:
//	  Type: AWS::DynamoDB::Table
//	  Properties:
//	    TableName: orders_idem
//	    BillingMode: PAY_PER_REQUEST
//	    AttributeDefinitions:
//	      - AttributeName: id
//	        AttributeType: S
//	    KeySchema:
//	      - AttributeName: id
//	        KeyType: HASH
//	    TimeToLiveSpecification:
//	      AttributeName: ttl
//	      Enabled: true
//
// Terraform:
//
//	resource "aws_dynamodb_table" "idem" {
//	  name         = "orders_idem"
//	  billing_mode = "PAY_PER_REQUEST"
//	  hash_key     = "id"
//	  attribute {
//	    name = "id"
//	    type = "S"
//	  }
//	  ttl {
//	    attribute_name = "ttl"
//	    enabled        = true
//	  }
//	}
//
// The service's role needs dynamodb:GetItem, PutItem, UpdateItem and
// DeleteItem on the table, DescribeTable for [Store.Ping], and Scan for
// [Store.List] (idemctl's ls).
//
// # Round trips
//
// Every operation is a conditional write, atomic on its item, so that two
// instances never both acquire a key, and an owner whose lease ran out
// never completes or releases an entry another owner took (the fence):
//
//   - a first execution: a PutItem (if no live item: the lease) and an
//     UpdateItem (if still the owner's: the record);
//   - a replay, or a duplicate in flight: the same PutItem, whose failed
//     condition brings the item back (ReturnValuesOnConditionCheckFailure).
//     An API that does not send it back (dynalite, and DynamoDB Local
//     before it knew the parameter) costs a strongly consistent GetItem
//     more;
//   - a lease renewal: one UpdateItem; a release: one DeleteItem (and an
//     UpdateItem for an entry taken from an issue).
//
// A failed condition is never an error the caller sees: it is how the
// store learns what holds the key. On DynamoDB a failed conditional write
// consumes write capacity as a write would, so a replay costs writes, not
// reads.
//
// # Records
//
// An item holds at most 400 KB ([MaxItemBytes]). A record of more than
// 4 KiB is compressed (DEFLATE, the fastest level) when that saves an
// eighth of it. The decision: DynamoDB bills writes per KB and reads per
// 4 KB, and JSON responses compress five to ten times, so a 40 KB answer
// costs a tenth of its writes and a response of a few MB still fits; a
// record under 4 KiB, the common case, is at most a few write units
// whatever is done, and is kept as it is, costing no CPU. A record that
// does not fit [MaxStoredRecordBytes] even compressed (an image, an
// archive, random bytes) is refused before anything is sent, with
// [storage.ErrTooLarge]: the middleware answers its client, then keeps the
// key done but not replayable, so a retry gets 409 ErrNotReplayable and
// the handler never runs twice. A service whose answers are that large
// keeps them elsewhere (S3) and answers a reference.
//
// # Clocks
//
// DynamoDB has no clock a condition can read: leases and TTLs are measured
// on the clock of the instance that writes them, and compared with the
// clock of the instance that reads them. Instances on AWS keep within a
// millisecond of each other (Amazon Time Sync); one whose clock runs ahead
// by d sees other owners' leases end d early, and may take a key whose
// execution still runs. Keep the lease (the middleware's WithLease, 30 s by
// default, renewed while the handler runs) far longer than any skew; the
// fence still refuses the late owner's Complete (ErrNotOwner), but its work
// has run twice. The TTL of a done entry is long, and a skew of seconds
// moves its end by seconds.
//
// # Errors
//
// Throttling (ProvisionedThroughputExceededException, ThrottlingException,
// RequestLimitExceeded) and DynamoDB's internal errors are retried by the
// SDK's retryer (three attempts by default; configure it on the client);
// what is left is the store being unavailable: the middleware answers 503
// with Retry-After, and the handler does not run (or runs unprotected with
// WithFailOpen). The request's context bounds the whole. A missing table
// is a ResourceNotFoundException on every call, which [Store.Ping] turns
// into a clear error at startup ([ErrTable]).
//
// # What it does not promise
//
//   - A global table replicates between regions with last writer wins:
//     two regions can each acquire one key, and both run the work. Give
//     the store a table in one region (a regional table, or write to one
//     region of a global table from every region), or keep the keys of
//     each region apart.
//   - DAX, or any cache of eventually consistent reads, must not serve the
//     store: its reads are strongly consistent on purpose.
//   - There is no fence in the application's transaction yet (pgstore's
//     and sqlstore's Fence): a process killed between its own write and
//     the storing of the response leaves an in-flight entry whose lease
//     runs out, and the retry runs the handler again. Make that write
//     conditional on an attribute of its own (the owner token: the
//     Owner of the idem.Info that idem.FromContext returns) where it
//     matters.
//   - The tests run against dynalite, an implementation of the DynamoDB
//     API in Node.js: it shows the API's behaviour (conditions, types,
//     the item limit), not DynamoDB's latency (single-digit ms in a
//     region), its throttling, its TTL deletion or its replication.
package dynamostore
