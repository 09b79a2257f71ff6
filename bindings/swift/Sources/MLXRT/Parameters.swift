import CMLXRT

/// Engine settings. Defaults are the C library's (`mlxrt_engine_config_init`).
public struct EngineConfiguration: Sendable {
    public enum Device: Int32, Sendable {
        case automatic = 0  // the GPU where present
        case cpu = 1
        case gpu = 2
    }

    /// A `.gguf` file or a Hugging Face MLX-format folder.
    public var modelPath: String
    public var device: Device
    /// Requests accepted but not finished before generate fails with `.busy`.
    public var maxInFlight: UInt32
    /// Requests batched together; the rest wait in FIFO order.
    public var maxRows: UInt32
    public var prefillChunk: UInt32
    public var kvBudget: UInt64
    /// Base seed for requests without their own.
    public var seed: UInt64
    /// Bytes of prompt-cache snapshots kept in memory; 0 turns the cache off.
    public var promptCacheBytes: UInt64
    /// Where the prompt cache persists across restarts; nil = memory only.
    public var promptCacheDirectory: String?
    /// A smaller model with the same tokenizer that drafts tokens for
    /// speculative decoding; requests then default to `.draft()`
    /// (`GenerateParameters.speculation`). nil = none.
    public var draftModelPath: String?

    public init(modelPath: String) {
        var c = mlxrt_engine_config()
        mlxrt_engine_config_init(&c)
        self.modelPath = modelPath
        device = Device(rawValue: c.device) ?? .automatic
        maxInFlight = c.max_in_flight
        maxRows = c.max_rows
        prefillChunk = c.prefill_chunk
        kvBudget = c.kv_budget
        seed = c.seed
        promptCacheBytes = c.prompt_cache_bytes
        promptCacheDirectory = nil
        draftModelPath = nil
    }
}

/// An image for a chat message (`Message.images`), for models with a vision tower
/// (`EngineInfo.modalities` has `MLXRT_MODALITY_IMAGE`): an encoded file or
/// raw pixels. mlxrt reads the bytes while `generate` submits the request
/// and keeps nothing, so a buffer wrapped without copying
/// (`Data(bytesNoCopy:count:deallocator: .none)`) may be reused once
/// `generate` has returned.
///
///     let photo = ImageInput.encoded(try Data(contentsOf: url))
///     engine.generate(messages: [.user("What is in this picture?", images: [photo])])
///
/// Undecodable data, a buffer shorter than its rows or more than 50 million
/// pixels make the stream throw `.invalidArgument`; an image sent to a model
/// without a vision tower, `.unsupported`.
public struct ImageInput: Sendable, Hashable {
    /// 8 bits per channel; alpha is ignored.
    public enum PixelFormat: Int32, Sendable {
        case rgb8 = 1
        case rgba8 = 2
        /// Blue first: Core Graphics' 32-bit little-endian layout
        /// (`noneSkipFirst`/`premultipliedFirst` + `byteOrder32Little`),
        /// and CVPixelBuffer's `kCVPixelFormatType_32BGRA`.
        case bgra8 = 3
    }

    /// The file's bytes, or the pixel rows.
    public var data: Data
    /// nil: `data` is a JPEG, PNG or WebP file.
    public var pixelFormat: PixelFormat?
    /// Raw pixels only (0 for a file); `bytesPerRow` 0 = packed rows.
    public var width: Int
    public var height: Int
    public var bytesPerRow: Int

    /// A JPEG, PNG or WebP file's bytes.
    public static func encoded(_ data: Data) -> ImageInput {
        ImageInput(data: data, pixelFormat: nil, width: 0, height: 0, bytesPerRow: 0)
    }

    /// Raw pixels: `height` rows `bytesPerRow` apart (0 = packed), each
    /// `width` pixels in `format`.
    public static func pixels(_ data: Data, width: Int, height: Int, bytesPerRow: Int = 0,
                              format: PixelFormat) -> ImageInput {
        ImageInput(data: data, pixelFormat: format, width: width, height: height, bytesPerRow: bytesPerRow)
    }
}

/// An audio clip for a chat message (`Message.audio`), for models with an
/// audio tower (`EngineInfo.modalities` has `MLXRT_MODALITY_AUDIO`): a WAV
/// file, or mono float samples. mlxrt reads the bytes while `generate`
/// submits the request and keeps nothing.
///
///     let clip = AudioInput.wav(try Data(contentsOf: url))
///     engine.generate(messages: [.user("What is said?", audio: [clip])])
///
/// Audio at another rate than the model's (16 kHz for Gemma 4) makes the
/// stream throw `.unsupported`; undecodable data, `.invalidArgument`.
public struct AudioInput: Sendable, Hashable {
    /// The WAV file's bytes, or the samples (`Float`s, native byte order).
    public var data: Data
    /// nil: `data` is a WAV file (PCM 8/16/24/32-bit or float; channels are
    /// averaged); else the samples' rate in Hz.
    public var sampleRate: Int?

    /// A WAV file's bytes.
    public static func wav(_ data: Data) -> AudioInput {
        AudioInput(data: data, sampleRate: nil)
    }

    /// Mono samples in -1...1 at `sampleRate` Hz.
    public static func samples(_ samples: [Float], sampleRate: Int) -> AudioInput {
        AudioInput(data: samples.withUnsafeBufferPointer { Data(buffer: $0) }, sampleRate: sampleRate)
    }
}

/// One chat message, optionally with images and audio (which come before
/// its text, as content parts: images, then audio).
public struct Message: Sendable, Hashable, Codable {
    public var role: String
    public var content: String
    /// Not part of the Codable form (role and content only).
    public var images: [ImageInput] = []
    /// Not part of the Codable form (role and content only).
    public var audio: [AudioInput] = []

    private enum CodingKeys: String, CodingKey {
        case role, content
    }

    public init(role: String, content: String, images: [ImageInput] = [], audio: [AudioInput] = []) {
        self.role = role
        self.content = content
        self.images = images
        self.audio = audio
    }

    public static func system(_ content: String) -> Message { Message(role: "system", content: content) }
    public static func user(_ content: String, images: [ImageInput] = [], audio: [AudioInput] = []) -> Message {
        Message(role: "user", content: content, images: images, audio: audio)
    }
    public static func assistant(_ content: String) -> Message { Message(role: "assistant", content: content) }
}

/// Sampling and limits of one request. Defaults are the C library's
/// (`mlxrt_request_params_init`): greedy, 256 tokens.
public struct GenerateParameters: Sendable {
    public var maxTokens: UInt32
    /// 0 = greedy.
    public var temperature: Float
    /// 0 = off.
    public var topP: Float
    /// 0 = off.
    public var topK: Int32
    /// 0 = off.
    public var minP: Float
    /// 1 = off.
    public var repetitionPenalty: Float
    /// Makes sampling reproducible; nil = the engine's seed sequence.
    public var seed: UInt64?
    /// Generation stops when one appears in the text, which ends before it.
    public var stop: [String]
    /// OpenAI-style fields as a JSON object, applied after the fields above
    /// (e.g. `{"ignore_eos": true}`).
    public var optionsJSON: String?
    /// Structured output: the shape the output must have (merged into the
    /// options as `response_format`); nil = free text.
    public var responseFormat: ResponseFormat?
    /// Speculative decoding (merged into the options as `speculation`); nil =
    /// the engine's default (draft speculation when it has a draft model).
    public var speculation: Speculation?
    /// Prompt-cache namespace: cached state is shared only within one.
    public var cacheNamespace: String?
    /// false: this request neither uses nor fills the prompt cache.
    public var usesPromptCache: Bool
    /// For models with a thinking mode: think or not; nil = the template's default.
    public var thinking: Bool?
    /// true: `.text` and `.reasoning` events carry each token's log-probability,
    /// with `topLogprobs` most likely alternatives (0...20).
    public var logprobs: Bool
    public var topLogprobs: UInt32

    public init() {
        var p = mlxrt_request_params()
        mlxrt_request_params_init(&p)
        maxTokens = p.max_tokens
        temperature = p.temperature
        topP = p.top_p
        topK = p.top_k
        minP = p.min_p
        repetitionPenalty = p.repetition_penalty
        seed = nil
        stop = []
        optionsJSON = nil
        responseFormat = nil
        speculation = nil
        cacheNamespace = nil
        usesPromptCache = p.no_prompt_cache == 0
        thinking = nil
        logprobs = p.logprobs != 0
        topLogprobs = p.top_logprobs
    }
}

/// Structured output: what the generated text must be. A schema, regex or
/// grammar that cannot be compiled fails the submit (invalid argument).
public enum ResponseFormat: Sendable, Equatable {
    /// A JSON document valid against this JSON schema (JSON text).
    case jsonSchema(String)
    /// Any JSON object.
    case jsonObject
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    case regex(String)
    /// Text in the language of this grammar (llguidance's Lark dialect).
    case lark(String)

    /// The `response_format` option's JSON.
    public var json: String {
        switch self {
        case .jsonSchema(let schema): return "{\"type\":\"json_schema\",\"schema\":\(schema)}"
        case .jsonObject: return "{\"type\":\"json_object\"}"
        case .regex(let pattern): return "{\"type\":\"regex\",\"pattern\":\(quotedJSON(pattern))}"
        case .lark(let grammar): return "{\"type\":\"grammar\",\"lark\":\(quotedJSON(grammar))}"
        }
    }

    /// `options` (a JSON object's text, or nil) with this format added.
    func merged(into options: String?) -> String {
        mergedOptions(options, field: "\"response_format\":\(json)")
    }
}

/// Speculative decoding: how a request drafts tokens that the model checks
/// in one forward pass (greedy output unchanged).
public enum Speculation: Sendable, Equatable {
    /// One token per step.
    case off
    /// Prompt lookup: drafts copied from the prompt and output (nil = 10).
    case ngram(numTokens: UInt32? = nil)
    /// The engine's draft model (`EngineConfiguration.draftModelPath`) drafts
    /// greedily (nil = 3 tokens per step).
    case draft(numTokens: UInt32? = nil)

    /// The `speculation` option's JSON.
    public var json: String {
        switch self {
        case .off: return "\"off\""
        case .ngram(nil): return "\"ngram\""
        case .ngram(let n?): return "{\"type\":\"ngram\",\"num_tokens\":\(n)}"
        case .draft(nil): return "\"draft\""
        case .draft(let n?): return "{\"type\":\"draft\",\"num_tokens\":\(n)}"
        }
    }

    /// `options` (a JSON object's text, or nil) with this choice added.
    func merged(into options: String?) -> String {
        mergedOptions(options, field: "\"speculation\":\(json)")
    }
}

/// `options` (a JSON object's text, or nil) with `field` ("name":value) added.
func mergedOptions(_ options: String?, field: String) -> String {
    guard let options = options else { return "{\(field)}" }
    guard let open = options.firstIndex(of: "{"), let close = options.lastIndex(of: "}"), open < close else {
        return options  // not an object: mlxrt reports it
    }
    let inside = options[options.index(after: open)..<close]
    let empty = inside.allSatisfy { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }
    return String(options[..<close]) + (empty ? "" : ",") + field + String(options[close...])
}

/// `s` as a JSON string literal.
func quotedJSON(_ s: String) -> String {
    var out = "\""
    for u in s.unicodeScalars {
        switch u {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        default:
            if u.value < 0x20 {
                let hex = String(u.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            } else {
                out.unicodeScalars.append(u)
            }
        }
    }
    return out + "\""
}

/// Why a request ended.
public enum FinishReason: Int32, Sendable {
    /// An end-of-sequence token or a stop string.
    case stop = 1
    /// `maxTokens` or the model's context length.
    case length = 2
    /// The stream was terminated (or its task cancelled) before the end.
    case cancelled = 3
    /// The model ended its turn after calling tools (`.toolCall` events).
    case toolCalls = 4
}

/// Token counts and timings of a finished request.
public struct Usage: Sendable, Equatable {
    public var promptTokens: Int
    /// Prompt tokens served from the prompt cache.
    public var cachedTokens: Int
    public var completionTokens: Int
    /// Seconds from submission to the first generated token.
    public var timeToFirstToken: Double
    public var prefillTokensPerSecond: Double
    public var decodeTokensPerSecond: Double

    init(_ u: mlxrt_usage) {
        promptTokens = Int(u.prompt_tokens)
        cachedTokens = Int(u.cached_tokens)
        completionTokens = Int(u.completion_tokens)
        timeToFirstToken = u.ttft_ms / 1000
        prefillTokensPerSecond = u.prefill_tokens_per_s
        decodeTokensPerSecond = u.decode_tokens_per_s
    }
}

/// A tool call the model made; `arguments` is a JSON object.
public struct ToolCall: Sendable, Equatable {
    public var id: String
    public var name: String
    public var arguments: String
}

/// A generated token's log-probability (natural log, over the model's
/// distribution before temperature and sampling filters) and, if asked for,
/// the most likely alternatives, most likely first.
public struct TokenLogprob: Sendable, Equatable {
    public struct Alternative: Sendable, Equatable {
        public var token: UInt32
        public var logprob: Float
    }

    public var token: UInt32
    public var logprob: Float
    public var top: [Alternative]
}

/// Facts about an engine's model (`mlxrt_engine_info`).
public struct EngineInfo: Sendable, Equatable {
    /// "llama", ...
    public var architecture: String
    /// "gguf" or "mlx-folder".
    public var modelFormat: String
    /// "cpu" or "gpu".
    public var device: String
    /// The MLX version the library runs on.
    public var mlxVersion: String
    /// Maximum sequence length (prompt + generated); 0 if unknown.
    public var contextLength: UInt64
    public var vocabSize: UInt32
    public var numLayers: UInt32
    public var hiddenSize: UInt32
    public var parameterBytes: UInt64
    /// Beginning-of-sequence token id, if the model has one.
    public var bosTokenID: UInt32?
    /// Ids that end generation.
    public var eosTokenIDs: [UInt32]
    /// Ids of special tokens (control tokens such as `<|im_start|>`).
    public var specialTokenIDs: [UInt32]
    /// The model has a chat template (`generate(messages:)` works).
    public var hasChatTemplate: Bool
    public var supportsTools: Bool
    /// The chat template has a thinking mode.
    public var supportsReasoning: Bool
    /// `MLXRT_MODALITY_*` bits of accepted inputs.
    public var modalities: UInt32

    init(_ i: mlxrt_engine_info) {
        architecture = String(cString: i.architecture)
        modelFormat = String(cString: i.model_format)
        device = String(cString: i.device)
        mlxVersion = String(cString: i.mlx_version)
        contextLength = i.context_length
        vocabSize = i.vocab_size
        numLayers = i.num_layers
        hiddenSize = i.hidden_size
        parameterBytes = i.parameter_bytes
        bosTokenID = i.bos_token_id >= 0 ? UInt32(i.bos_token_id) : nil
        eosTokenIDs = Array(UnsafeBufferPointer(start: i.eos_token_ids, count: i.n_eos_token_ids))
        specialTokenIDs = Array(UnsafeBufferPointer(start: i.special_token_ids, count: i.n_special_token_ids))
        hasChatTemplate = i.has_chat_template != 0
        supportsTools = i.supports_tools != 0
        supportsReasoning = i.supports_reasoning != 0
        modalities = i.modalities
    }
}

/// The engine's counters at one moment (`mlxrt_engine_stats`). The engine
/// publishes them after every step, so they lag events by a moment.
public struct EngineStats: Sendable, Equatable {
    /// Requests waiting for admission, prefilling or generating, submitted
    /// and not yet ended, and ended since the engine started.
    public var queued: UInt64
    public var active: UInt64
    public var inFlight: UInt64
    public var completed: UInt64
    /// Bytes held by KV caches now, and reserved by running requests.
    public var kvBytes: UInt64
    public var kvReserved: UInt64
    /// MLX allocator: bytes in use, peak, and held in its cache.
    public var activeMemory: UInt64
    public var peakMemory: UInt64
    public var cacheMemory: UInt64
    /// Prompt cache: requests that reused cached tokens, that did not, prompt
    /// tokens it supplied, bytes in memory and on disk.
    public var promptCacheHits: UInt64
    public var promptCacheMisses: UInt64
    public var promptCacheHitTokens: UInt64
    public var promptCacheMemoryBytes: UInt64
    public var promptCacheDiskBytes: UInt64
    /// Encoder cache (vision tower outputs by image content): bytes and
    /// entries it holds, images it supplied, and images the vision tower
    /// encoded (a repeated image counts as a hit, not a tower run).
    public var encoderCacheBytes: UInt64
    public var encoderCacheEntries: UInt64
    public var encoderCacheHits: UInt64
    public var towerRuns: UInt64

    init(_ s: mlxrt_engine_stats) {
        queued = s.queued
        active = s.active
        inFlight = s.in_flight
        completed = s.completed
        kvBytes = s.kv_bytes
        kvReserved = s.kv_reserved
        activeMemory = s.active_memory
        peakMemory = s.peak_memory
        cacheMemory = s.cache_memory
        promptCacheHits = s.prompt_cache_hits
        promptCacheMisses = s.prompt_cache_misses
        promptCacheHitTokens = s.prompt_cache_hit_tokens
        promptCacheMemoryBytes = s.prompt_cache_memory_bytes
        promptCacheDiskBytes = s.prompt_cache_disk_bytes
        encoderCacheBytes = s.encoder_cache_bytes
        encoderCacheEntries = s.encoder_cache_entries
        encoderCacheHits = s.encoder_cache_hits
        towerRuns = s.tower_runs
    }
}

/// A conversation rendered with the model's chat template: the prompt text
/// and its token ids, exactly what a request with these messages processes.
public struct RenderedChat: Sendable, Equatable {
    public var text: String
    public var tokens: [UInt32]
}

/// What a generation stream yields: any number of `.text`, `.reasoning` and
/// `.toolCall`, then one `.done` (or the stream throws an `MLXRTError`).
public enum Event: Sendable, Equatable {
    /// New answer text (complete UTF-8), the ids of the tokens it came from,
    /// and their log-probabilities (empty unless `GenerateParameters.logprobs`).
    case text(String, tokens: [UInt32], logprobs: [TokenLogprob])
    /// New thinking text, for models that think.
    case reasoning(String, tokens: [UInt32], logprobs: [TokenLogprob])
    case toolCall(ToolCall)
    case done(FinishReason, Usage)
}
