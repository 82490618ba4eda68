/**
 * hotsplit: a client for hotsplit's Redis door that carries a session per scope, on ioredis.
 *
 * Every call of a {@link Session} sends the tokens it holds with `SESSION` and keeps the token
 * the service answers in place of the ones that call sent, so answers that arrive out of order
 * (calls at once) are merged by the service and no floor is lost.
 */
import Redis, { RedisOptions, ReplyError } from "ioredis";

/** An error answer of the door; `prefix` is its first word (`FLOOR`, `UNAVAILABLE`, ...). */
export class HotsplitError extends Error {
  constructor(message: string, readonly prefix: string) {
    super(message);
    this.name = new.target.name;
  }
}
/** `ERR`: bad input (an invalid key or version, a refused option). */
export class InvalidError extends HotsplitError {}
/** `NOAUTH`: the connection has not authenticated and the instance has tokens. */
export class NoAuthError extends HotsplitError {}
/** `WRONGPASS`: an unknown token, or a user other than `default`. */
export class WrongPassError extends HotsplitError {}
/** `NOPERM`: the token lacks the scope the command needs. */
export class NoPermError extends HotsplitError {}
/** `FLOOR`: no copy reached the read's floor yet; retry later. */
export class FloorError extends HotsplitError {}
/** `UNAVAILABLE`: a node the command needs did not answer; retry later. */
export class UnavailableError extends HotsplitError {}
/** `OVERLOADED`: the instance is at its in-flight bound; the command did nothing. */
export class OverloadedError extends HotsplitError {}
/** `DEADLINE`: the command's deadline passed before the store answered. */
export class DeadlineError extends HotsplitError {}
/** `STALE`: every replica is over the class's staleness budget and the class fails. */
export class StaleError extends HotsplitError {}
/** `FULL`: the embedded store is full; the publish changed nothing. */
export class FullError extends HotsplitError {}

const BY_PREFIX: Record<string, new (message: string, prefix: string) => HotsplitError> = {
  ERR: InvalidError,
  NOAUTH: NoAuthError,
  WRONGPASS: WrongPassError,
  NOPERM: NoPermError,
  FLOOR: FloorError,
  UNAVAILABLE: UnavailableError,
  OVERLOADED: OverloadedError,
  DEADLINE: DeadlineError,
  STALE: StaleError,
  FULL: FullError,
};

/** The typed error of an ioredis error answer; other errors (connection, timeout) as they are. */
export function fromReply(error: unknown): unknown {
  if (!(error instanceof ReplyError)) {
    return error;
  }
  const text = (error as Error).message;
  const word = text.split(" ", 1)[0];
  const Kind = BY_PREFIX[word] ?? HotsplitError;
  return new Kind(text, word);
}

/** A read's value with its metadata (`meta: true`). */
export interface Read {
  /** The value (UTF-8); `null` when the key is missing or invalidated. */
  value: string | null;
  /** The version served. */
  version: number | null;
  /** The copy that served it. */
  copy: number | null;
  /** `node=…;role=primary|replica` (or `embedded`). */
  servedBy: string | null;
  /** `class=…;reason=…[;source=near-cache;age_ms=…]`. */
  route: string | null;
  /** The near-cache age of the value, when the near cache answered. */
  ageMs: number | null;
}

/** A publish or invalidate report. */
export interface Published {
  key: string;
  version: number;
  /** `done`, `queued`, `stale`, `conflict` or `incomplete`. */
  status: string;
  httpStatus: number;
  /** `copies`, `applied`, `current`, `stale`, `conflict`, `failed`, `queued`, `dropped`. */
  counts: Record<string, number>;
}

/** What one read asks beyond its key. */
export interface ReadOptions {
  /** The read class of this call (a session's own otherwise, else the family's default). */
  readClass?: string;
  /** A floor of this call: never a version below it. */
  minVersion?: number;
  /** The client id of this call (a session's own otherwise, else the connection's). */
  clientId?: string;
  /** Answer a {@link Read} with the metadata instead of the value alone. */
  meta?: boolean;
}

type Reply = unknown;

function fields(reply: Reply): Map<string, unknown> {
  const map = new Map<string, unknown>();
  if (Array.isArray(reply)) {
    for (let at = 0; at + 1 < reply.length; at += 2) {
      map.set(String(reply[at]), reply[at + 1]);
    }
  }
  return map;
}

function num(value: unknown): number | null {
  return value === null || value === undefined ? null : Number(value);
}

function str(value: unknown): string | null {
  return value === null || value === undefined ? null : String(value);
}

/**
 * The floors of one scope (a user, a request): the tokens it holds, sent with every call. Make
 * one per scope; share it across the calls of that scope, at once or not. `token` gets and sets
 * what it holds, to hand the session to another service or process.
 */
export class Session {
  private tokens: string[] = [];

  constructor(
    private readonly client: Client,
    token?: string | null,
    /** The client id of this scope's calls (its affine copy). */
    public clientId?: string,
    /** The read class of this scope's reads. */
    public readClass?: string,
  ) {
    this.token = token ?? null;
  }

  /** The session token: the tokens held, comma-separated (the service merges them). */
  get token(): string | null {
    return this.tokens.length ? this.tokens.join(",") : null;
  }

  set token(token: string | null) {
    this.tokens = (token ?? "")
      .split(",")
      .map((part) => part.trim())
      .filter((part) => part.length > 0);
  }

  /** The tokens a call sends. @internal */
  sent(): string[] {
    return [...this.tokens];
  }

  /** Keeps `answered` in place of the tokens its call `sent`. @internal */
  keep(sent: string[], answered: unknown): void {
    const token = str(answered);
    if (!token) {
      return;
    }
    this.tokens = this.tokens.filter((held) => !sent.includes(held) && held !== token);
    this.tokens.push(token);
  }

  read(key: string, options: ReadOptions & { meta: true }): Promise<Read>;
  read(key: string, options?: ReadOptions): Promise<string | null>;
  /** {@link Client.read} in this session. */
  read(key: string, options: ReadOptions = {}): Promise<string | null | Read> {
    return this.client.read(key, { ...options, session: this });
  }

  /** {@link Client.publish} in this session. */
  publish(key: string, version: number | null, value: string | Buffer): Promise<Published> {
    return this.client.publish(key, version, value, { session: this });
  }

  /** {@link Client.invalidate} in this session. */
  invalidate(key: string, version: number | null): Promise<Published> {
    return this.client.invalidate(key, version, { session: this });
  }
}

/**
 * A client of one hotsplit instance's Redis door (`[resp] listen`), over ioredis: give it the
 * ioredis options (host, port, `password`, `username`, `tls`, ...), a URL
 * (`redis://` or `rediss://`), or an ioredis client of your own.
 */
export class Client {
  readonly redis: Redis;

  constructor(connection?: RedisOptions | string | Redis) {
    if (connection instanceof Redis) {
      this.redis = connection;
    } else if (typeof connection === "string") {
      this.redis = new Redis(connection);
    } else {
      this.redis = new Redis(connection ?? {});
    }
  }

  /** A new scope, starting from `token` when given (one handed over by another service). */
  session(options: { token?: string | null; clientId?: string; readClass?: string } = {}): Session {
    return new Session(this, options.token, options.clientId, options.readClass);
  }

  private async call(args: (string | Buffer)[], session?: Session): Promise<Reply> {
    const sent = session ? session.sent() : [];
    if (session) {
      args = [...args, "SESSION", ...sent];
    }
    let reply: Reply;
    try {
      reply = await this.redis.call(String(args[0]), ...args.slice(1));
    } catch (error) {
      throw fromReply(error);
    }
    if (session && reply !== null) {
      session.keep(sent, fields(reply).get("session"));
    }
    return reply;
  }

  read(key: string, options: ReadOptions & { meta: true; session?: Session }): Promise<Read>;
  read(key: string, options?: ReadOptions & { session?: Session }): Promise<string | null>;
  /**
   * Reads `key`: its value (`null` when missing), or with `meta: true` a {@link Read}. Rejects
   * with the typed error of the door's answer.
   */
  async read(
    key: string,
    options: ReadOptions & { session?: Session } = {},
  ): Promise<string | null | Read> {
    const session = options.session;
    const args: string[] = ["HOTSPLIT.READ", key];
    const readClass = options.readClass ?? session?.readClass;
    const clientId = options.clientId ?? session?.clientId;
    if (readClass) args.push("CLASS", readClass);
    if (options.minVersion !== undefined) args.push("MINVERSION", String(options.minVersion));
    if (clientId) args.push("CLIENT", clientId);
    const got = fields(await this.call(args, session));
    const value = str(got.get("value"));
    if (!options.meta) {
      return value;
    }
    return {
      value,
      version: num(got.get("version")),
      copy: num(got.get("copy")),
      servedBy: str(got.get("served_by")),
      route: str(got.get("route")),
      ageMs: num(got.get("age_ms")),
    };
  }

  /**
   * Publishes `value` at `version` (`null`: `*`, the family allocates it). `sync` waits for
   * replicas. A refused publish (`stale`, `conflict`) is a report, not an error.
   */
  async publish(
    key: string,
    version: number | null,
    value: string | Buffer,
    options: { session?: Session; sync?: { replicas: number; timeoutMs: number } } = {},
  ): Promise<Published> {
    const args: (string | Buffer)[] = ["HOTSPLIT.PUBLISH", key, version === null ? "*" : String(version), value];
    if (options.sync) {
      args.push("SYNC", String(options.sync.replicas), String(options.sync.timeoutMs));
    }
    return report(await this.call(args, options.session));
  }

  /** Invalidates `key` at `version` (`null`: `*`). */
  async invalidate(
    key: string,
    version: number | null,
    options: { session?: Session } = {},
  ): Promise<Published> {
    const args = ["HOTSPLIT.INVALIDATE", key, version === null ? "*" : String(version)];
    return report(await this.call(args, options.session));
  }

  /** Closes the connection underneath. */
  async close(): Promise<void> {
    await this.redis.quit();
  }
}

function report(reply: Reply): Published {
  const got = fields(reply);
  const counts: Record<string, number> = {};
  for (const name of ["copies", "applied", "current", "stale", "conflict", "failed", "queued", "dropped"]) {
    if (got.has(name)) counts[name] = Number(got.get(name));
  }
  return {
    key: str(got.get("key")) ?? "",
    version: Number(got.get("version") ?? 0),
    status: str(got.get("status")) ?? "",
    httpStatus: Number(got.get("http_status") ?? 0),
    counts,
  };
}
