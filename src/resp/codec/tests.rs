//! The parser's and the encoder's unit tests: every split point of a pipelined buffer, Redis's
//! error texts, `sdssplitargs`' quoting, and both protocol versions' encodings.

use super::*;

const LIMITS: Limits = Limits {
    max_bulk: 64,
    max_args: 8,
    max_inline: 64,
};

/// Every command `input` parses to in one read, or the error.
fn parse_all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
    let mut parser = Parser::new(LIMITS);
    let mut buf = BytesMut::from(input);
    let mut commands = Vec::new();
    while let Some(command) = parser.next(&mut buf)? {
        commands.push(command);
    }
    Ok(commands)
}

/// The commands `input` parses to when it arrives in the pieces `cuts` makes.
fn parse_in_pieces(input: &[u8], cuts: &[usize]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
    let mut parser = Parser::new(LIMITS);
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    let mut from = 0;
    for &cut in cuts.iter().chain([&input.len()]) {
        buf.extend_from_slice(&input[from..cut]);
        from = cut;
        while let Some(command) = parser.next(&mut buf)? {
            commands.push(command);
        }
    }
    assert!(buf.is_empty(), "bytes left over: {buf:?}");
    Ok(commands)
}

fn args(words: &[&str]) -> Vec<Bytes> {
    words
        .iter()
        .map(|word| Bytes::copy_from_slice(word.as_bytes()))
        .collect()
}

const PIPELINE: &[u8] = b"*2\r\n$3\r\nGET\r\n$1\r\nx\r\nPING\r\n\r\n*0\r\n*3\r\n$4\r\nMGET\r\n$0\r\n\r\n$2\r\nab\r\nSET k \"a b\\n\" 'c'\r\n*-1\r\n*1\r\n$4\r\nQUIT\r\n";

fn pipeline_commands() -> Vec<Vec<Bytes>> {
    vec![
        args(&["GET", "x"]),
        args(&["PING"]),
        args(&["MGET", "", "ab"]),
        args(&["SET", "k", "a b\n", "c"]),
        args(&["QUIT"]),
    ]
}

#[test]
fn a_pipelined_buffer_parses_in_order_skipping_empty_requests() {
    assert_eq!(parse_all(PIPELINE).unwrap(), pipeline_commands());
}

#[test]
fn every_split_of_a_pipelined_buffer_parses_to_the_same_commands() {
    let expected = pipeline_commands();
    for cut in 0..=PIPELINE.len() {
        assert_eq!(
            parse_in_pieces(PIPELINE, &[cut]).unwrap(),
            expected,
            "cut at {cut}"
        );
    }
    for first in 0..=PIPELINE.len() {
        for second in first..=PIPELINE.len() {
            assert_eq!(
                parse_in_pieces(PIPELINE, &[first, second]).unwrap(),
                expected,
                "cuts at {first} and {second}"
            );
        }
    }
    let every_byte: Vec<usize> = (1..PIPELINE.len()).collect();
    assert_eq!(parse_in_pieces(PIPELINE, &every_byte).unwrap(), expected);
}

#[test]
fn a_bulk_argument_is_a_slice_of_the_read_buffer() {
    let mut parser = Parser::new(LIMITS);
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$5\r\nhello\r\n"[..]);
    let start = buf.as_ptr() as usize;
    let end = start + buf.len();
    let command = parser.next(&mut buf).unwrap().unwrap();
    for arg in &command {
        let at = arg.as_ptr() as usize;
        assert!(at >= start && at + arg.len() <= end, "{arg:?} was copied");
    }
}

#[test]
fn a_partial_command_is_kept_and_counted_and_its_bulk_is_announced() {
    let mut parser = Parser::new(LIMITS);
    let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$10\r\nabc"[..]);
    assert_eq!(parser.next(&mut buf).unwrap(), None);
    assert_eq!(buf.as_ref(), b"abc", "whole elements leave the buffer");
    assert_eq!(parser.wanted(&buf), 10 + 2 - 3);
    assert_eq!(
        parser.pending(&buf),
        3 + 10 + 2,
        "the awaited bulk counts at its declared length"
    );
    buf.extend_from_slice(b"defghij\r\n");
    assert_eq!(
        parser.next(&mut buf).unwrap(),
        Some(args(&["GET", "abcdefghij"]))
    );
    assert_eq!(parser.pending(&buf), 0);
}

#[test]
fn an_inline_command_has_max_args_too() {
    let mut parser = Parser::new(LIMITS);
    let mut buf = BytesMut::from(&b"MGET a b c d e f g\r\n"[..]);
    assert_eq!(
        parser.next(&mut buf).unwrap().map(|args| args.len()),
        Some(8)
    );
    let mut buf = BytesMut::from(&b"MGET a b c d e f g h\r\n"[..]);
    assert_eq!(
        parser.next(&mut buf).unwrap_err(),
        ProtocolError::InvalidMultibulkLength
    );
}

#[test]
fn bounds_and_malformed_lengths_give_redis_texts() {
    let cases: &[(&[u8], &str)] = &[
        (b"*99999999999\r\n", "invalid multibulk length"),
        (b"*9\r\n", "invalid multibulk length"),
        (b"*abc\r\n", "invalid multibulk length"),
        (b"*01\r\n", "invalid multibulk length"),
        (b"*1\r\n$99999999999\r\n", "invalid bulk length"),
        (b"*1\r\n$65\r\n", "invalid bulk length"),
        (b"*1\r\n$abc\r\n", "invalid bulk length"),
        (b"*1\r\n$-1\r\n", "invalid bulk length"),
        (b"*1\r\n$3\r\nabcde", "invalid bulk length"),
        (b"*1\r\nGET\r\n", "expected '$', got 'G'"),
        (b"*1\r\n\x01", "expected '$', got '\\x01'"),
        (b"\"abc\r\n", "unbalanced quotes in request"),
        (b"'abc\r\n", "unbalanced quotes in request"),
        (b"\"a\"b\r\n", "unbalanced quotes in request"),
    ];
    for (input, text) in cases {
        let err = parse_all(input).unwrap_err();
        assert_eq!(err.to_string(), *text, "{input:?}");
        assert_eq!(err.reply_text(), format!("ERR Protocol error: {text}"));
    }
    let long_line = vec![b'a'; 65];
    assert_eq!(
        parse_all(&long_line).unwrap_err(),
        ProtocolError::TooBigInline
    );
    let mut long_count = b"*".to_vec();
    long_count.extend(std::iter::repeat_n(b'1', 64));
    assert_eq!(
        parse_all(&long_count).unwrap_err(),
        ProtocolError::TooBigMultibulkCount
    );
    let mut long_len = b"*1\r\n$".to_vec();
    long_len.extend(std::iter::repeat_n(b'1', 64));
    assert_eq!(
        parse_all(&long_len).unwrap_err(),
        ProtocolError::TooBigBulkCount
    );
    // Right at the bounds is fine.
    let mut at_bound = b"*1\r\n$64\r\n".to_vec();
    at_bound.extend([b'v'; 64]);
    at_bound.extend(b"\r\n");
    assert_eq!(parse_all(&at_bound).unwrap()[0][0].len(), 64);
    assert_eq!(parse_all(&[b'a'; 64]).unwrap(), Vec::<Vec<Bytes>>::new());
}

#[test]
fn inline_arguments_split_as_sdssplitargs_does() {
    let cases: &[(&[u8], &[&[u8]])] = &[
        (b"GET x\n", &[b"GET", b"x"]),
        (b"  GET \t x  \r\n", &[b"GET", b"x"]),
        (b"SET k \"a\\x41\\n\\\"b\"\r\n", &[b"SET", b"k", b"aA\n\"b"]),
        (b"SET k 'it\\'s'\r\n", &[b"SET", b"k", b"it's"]),
        (b"SET k 'a\\nb'\r\n", &[b"SET", b"k", b"a\\nb"]),
        (b"SET k ab\"c d\"\r\n", &[b"SET", b"k", b"abc d"]),
        (b"SET k \"\"\r\n", &[b"SET", b"k", b""]),
        (b"SET k \"\\xZZ\"\r\n", &[b"SET", b"k", b"xZZ"]),
        (b"GET x\0 ignored\r\n", &[b"GET", b"x"]),
    ];
    for (input, expected) in cases {
        let parsed = parse_all(input).unwrap();
        let expected: Vec<Bytes> = expected.iter().map(|a| Bytes::copy_from_slice(a)).collect();
        assert_eq!(parsed, vec![expected], "{input:?}");
    }
    assert_eq!(
        parse_all(b"\r\n\n   \r\nPING\r\n").unwrap(),
        vec![args(&["PING"])]
    );
}

fn encoded(reply: &Reply, proto: Proto) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(reply, proto, &mut out);
    out.to_vec()
}

#[test]
fn replies_encode_in_both_protocol_versions() {
    let map = Reply::Map(vec![(Reply::bulk("server"), Reply::bulk("hotsplit"))]);
    let cases: &[(Reply, &[u8], &[u8])] = &[
        (Reply::OK, b"+OK\r\n", b"+OK\r\n"),
        (Reply::Status("a\r\nb".into()), b"+a  b\r\n", b"+a  b\r\n"),
        (
            Reply::error("ERR bad\nthing"),
            b"-ERR bad thing\r\n",
            b"-ERR bad thing\r\n",
        ),
        (Reply::Int(-42), b":-42\r\n", b":-42\r\n"),
        (
            Reply::Int(i64::MIN),
            b":-9223372036854775808\r\n",
            b":-9223372036854775808\r\n",
        ),
        (Reply::bulk("v"), b"$1\r\nv\r\n", b"$1\r\nv\r\n"),
        (Reply::Nil, b"$-1\r\n", b"_\r\n"),
        (
            Reply::Array(vec![Reply::Int(0), Reply::Nil]),
            b"*2\r\n:0\r\n$-1\r\n",
            b"*2\r\n:0\r\n_\r\n",
        ),
        (
            map,
            b"*2\r\n$6\r\nserver\r\n$8\r\nhotsplit\r\n",
            b"%1\r\n$6\r\nserver\r\n$8\r\nhotsplit\r\n",
        ),
        (
            Reply::Verbatim("a:1".into()),
            b"$3\r\na:1\r\n",
            b"=7\r\ntxt:a:1\r\n",
        ),
    ];
    for (reply, resp2, resp3) in cases {
        assert_eq!(encoded(reply, Proto::Resp2), *resp2, "{reply:?} in RESP2");
        assert_eq!(encoded(reply, Proto::Resp3), *resp3, "{reply:?} in RESP3");
    }
}

#[test]
fn lengths_parse_as_string2ll_does() {
    assert_eq!(parse_int(b"0"), Some(0));
    assert_eq!(parse_int(b"-1"), Some(-1));
    assert_eq!(parse_int(b"123"), Some(123));
    for bad in [
        &b""[..],
        b"-",
        b"-0",
        b"+1",
        b"01",
        b"1 ",
        b"99999999999999999999",
    ] {
        assert_eq!(parse_int(bad), None, "{bad:?}");
    }
}

#[test]
fn before_authentication_redis_tighter_bounds_apply() {
    let mut parser = Parser::new(Limits {
        max_bulk: 1 << 20,
        max_args: 64,
        max_inline: 1024,
    });
    parser.set_unauthenticated(true);
    let mut many = BytesMut::from(&b"*11\r\n"[..]);
    assert_eq!(
        parser.next(&mut many).unwrap_err().to_string(),
        "unauthenticated multibulk length"
    );
    let mut parser = Parser::new(Limits {
        max_bulk: 1 << 20,
        max_args: 64,
        max_inline: 1024,
    });
    parser.set_unauthenticated(true);
    let mut ok = BytesMut::from(&b"*2\r\n$4\r\nAUTH\r\n$5\r\ntoken\r\n*1\r\n$16385\r\n"[..]);
    assert_eq!(
        parser.next(&mut ok).unwrap(),
        Some(args(&["AUTH", "token"]))
    );
    assert_eq!(
        parser.next(&mut ok).unwrap_err(),
        ProtocolError::UnauthenticatedBulkLength
    );
    // Once authenticated, the configured bounds.
    let mut parser = Parser::new(Limits {
        max_bulk: 1 << 20,
        max_args: 64,
        max_inline: 1024,
    });
    parser.set_unauthenticated(false);
    let mut big = BytesMut::from(&b"*11\r\n$16385\r\n"[..]);
    assert_eq!(parser.next(&mut big).unwrap(), None);
}
