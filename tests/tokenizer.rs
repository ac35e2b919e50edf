//! The Qwen3 tokenizer wrapper against the official `tokenizer.json` (kept outside the repo in
//! `../shared/qwen3-tokenizer/`).

mod common;

use common::tokenizer_path;
use qwen_bpf::Error;
use qwen_bpf::Tokenizer;

fn tok() -> Tokenizer {
    Tokenizer::from_file(&tokenizer_path()).expect("the shared Qwen3 tokenizer loads")
}

const IM_START: u32 = 151644;
const IM_END: u32 = 151645;
const END_OF_TEXT: u32 = 151643;

#[test]
fn encodes_known_ids_and_round_trips() {
    let t = tok();
    let text = "Hello, world! 你好";
    let ids = t.encode(text).unwrap();
    assert_eq!(ids, [9707, 11, 1879, 0, 220, 108386]);
    assert_eq!(t.decode(&ids).unwrap(), text);
}

#[test]
fn special_tokens_have_their_ids_and_their_text_encodes_to_them() {
    let t = tok();
    assert_eq!(t.vocab_size(), 151_669);
    assert_eq!(t.token_id("<|im_start|>"), Some(IM_START));
    assert_eq!(t.token_id("<|im_end|>"), Some(IM_END));
    assert_eq!(t.token_id("<|endoftext|>"), Some(END_OF_TEXT));
    assert_eq!(t.token_id("no such token, surely"), None);
    assert_eq!(t.eos_ids(), [IM_END, END_OF_TEXT]);

    // Special-token text in the input is the special token, not its characters.
    let ids = t.encode("<|im_start|>hi<|im_end|>").unwrap();
    assert_eq!(ids.first(), Some(&IM_START));
    assert_eq!(ids.last(), Some(&IM_END));
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), "<|im_start|>hi<|im_end|>");
    assert_eq!(t.encode("<|endoftext|>").unwrap(), [END_OF_TEXT]);
    // Nothing is added around plain text.
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
}

#[test]
fn a_chat_prompt_wraps_the_message_and_ends_with_the_assistant_turn() {
    let t = tok();
    assert_eq!(
        Tokenizer::chat_prompt("Why is the sky blue?"),
        "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = t.encode_chat("Why is the sky blue?").unwrap();
    let user = t.encode("user").unwrap();
    let assistant = t.encode("assistant").unwrap();
    let nl = t.encode("\n").unwrap();
    assert_eq!(ids[0], IM_START);
    assert_eq!(ids[1..1 + user.len()], user[..]);
    assert_eq!(ids.iter().filter(|&&i| i == IM_START).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == IM_END).count(), 1);
    // Ends with the generation prompt: <|im_start|>assistant\n
    let tail: Vec<u32> = [vec![IM_START], assistant, nl].concat();
    assert!(ids.ends_with(&tail), "{ids:?} does not end with {tail:?}");
    assert_eq!(
        t.decode(&ids).unwrap(),
        Tokenizer::chat_prompt("Why is the sky blue?")
    );
}

#[test]
fn decode_rejects_unknown_ids() {
    let t = tok();
    match t.decode(&[9707, 151_900]) {
        Err(Error::TokenOutOfRange {
            id: 151_900,
            index: 1,
            vocab: 151_669,
        }) => {}
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert!(t.stream().push(200_000).is_err());
}

#[test]
fn streaming_holds_back_split_characters() {
    let t = tok();
    let text = "Hi! 你好，世界。🦀 Rust 🎉🎉 emoji 👩‍👩‍👧 and 日本語のテキスト. done";
    let ids = t.encode(text).unwrap();
    let full = t.decode(&ids).unwrap();
    assert_eq!(full, text);

    // Some single token of this text must be an incomplete UTF-8 fragment, or the test proves
    // nothing about holding back.
    let fragments = ids
        .iter()
        .filter(|&&id| {
            t.decode(&[id])
                .unwrap()
                .contains(char::REPLACEMENT_CHARACTER)
        })
        .count();
    assert!(fragments > 0, "no token in {ids:?} is a partial character");

    let mut stream = t.stream();
    let mut pieces = Vec::new();
    let mut held = 0;
    for (i, &id) in ids.iter().enumerate() {
        match stream.push(id).unwrap() {
            Some(piece) => pieces.push(piece),
            None => held += 1,
        }
        // Text is emitted as soon as it is whole: whenever the ids so far decode to complete
        // characters, everything has been emitted.
        let so_far = t.decode(&ids[..=i]).unwrap();
        if !so_far.ends_with(char::REPLACEMENT_CHARACTER) {
            assert_eq!(pieces.concat(), so_far, "after token {i}");
        }
    }
    if let Some(piece) = stream.finish().unwrap() {
        pieces.push(piece);
    }
    assert!(held > 0, "nothing was held back");
    for p in &pieces {
        assert!(!p.contains(char::REPLACEMENT_CHARACTER), "emitted {p:?}");
        assert!(!p.is_empty());
    }
    assert_eq!(pieces.concat(), full);
    assert!(pieces.len() > 10, "{pieces:?}");

    // finish() after everything was emitted has nothing to add.
    assert_eq!(stream.finish().unwrap(), None);
}

#[test]
fn streaming_finish_flushes_incomplete_tail() {
    let t = tok();
    // A rare 4-byte character (Egyptian hieroglyph A001) is surely split over byte-level tokens.
    let ids = t.encode("ab \u{13000}\u{13000}").unwrap();
    // Find a cut that leaves an incomplete character at the end.
    let cut = (1..ids.len())
        .find(|&n| {
            t.decode(&ids[..n])
                .unwrap()
                .ends_with(char::REPLACEMENT_CHARACTER)
        })
        .unwrap_or_else(|| panic!("no token of {ids:?} is a partial character"));
    let mut stream = t.stream();
    let mut out = String::new();
    for &id in &ids[..cut] {
        if let Some(p) = stream.push(id).unwrap() {
            out.push_str(&p);
        }
    }
    assert!(!out.contains(char::REPLACEMENT_CHARACTER));
    out.push_str(
        &stream
            .finish()
            .unwrap()
            .expect("the held-back bytes are flushed"),
    );
    assert_eq!(out, t.decode(&ids[..cut]).unwrap());
}

#[test]
fn from_model_dir_reads_tokenizer_json() {
    let dir = tokenizer_path().parent().unwrap().to_path_buf();
    let t = Tokenizer::from_model_dir(&dir).unwrap();
    assert_eq!(t.encode("Hello").unwrap(), [9707]);

    // A synthetic checkpoint directory carries a copy of the real tokenizer.
    let t =
        Tokenizer::from_model_dir(&common::tiny_model_with_tokenizer("tokenizer-tiny")).unwrap();
    assert_eq!(t.encode("Hello").unwrap(), [9707]);
    assert_eq!(
        t.path(),
        common::model_dir("tokenizer-tiny").join("tokenizer.json")
    );
}

#[test]
fn missing_file_is_io_error_naming_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    let err = Tokenizer::from_file(&path).unwrap_err();
    match &err {
        Error::Io { path: p, source } => {
            assert_eq!(p, &path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");

    let err = Tokenizer::from_model_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::Io { path: p, .. } if p == &path),
        "{err:?}"
    );
}

#[test]
fn broken_file_is_tokenizer_error_naming_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    for bytes in [
        &b"\xff\xfe\x00garbage{{{"[..],
        b"{\"version\": \"1.0\"}",
        b"",
    ] {
        std::fs::write(&path, bytes).unwrap();
        let err = Tokenizer::from_file(&path).unwrap_err();
        match &err {
            Error::Tokenizer { path: p, .. } => assert_eq!(p, &path),
            other => panic!("expected Tokenizer error, got {other:?}"),
        }
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
    }
}
