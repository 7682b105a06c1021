"""Every `detail` string the API checks produce, in one class: `Detail`."""

from __future__ import annotations


class Detail:
    """Every `detail` string this package produces.

    The first block is the reference's, byte-exact; the second is edgeserve's own (str.format
    templates for the 400s that replace the reference's 500s, and for limits).
    """

    INVALID_API_KEY = "Invalid API key."
    NOT_ALLOWED = "Not allowed"
    INVALID_LENGTH = "Invalid length"
    ONLY_UAUAU = "Only supports u/a/u/a/u..."
    INVALID_ROLE = "Invalid role"
    INVALID_REQUEST = "Invalid request"
    LOCAL_FILES_DISABLED = "Local file access is disabled."
    INVALID_FILE_PATH = "Invalid or inaccessible file path."
    URL_SCHEME = "Invalid URL: 400: Only HTTP/HTTPS URLs are allowed."
    URL_HOSTNAME = "Invalid URL: 400: Invalid URL hostname."
    URL_PRIVATE = "Invalid URL: 403: Access to private or reserved IP addresses is not allowed."
    URL_UNRESOLVABLE = "Could not resolve hostname: {host}"
    URL_OTHER = "Invalid URL: {error}"
    BODY_UNPARSABLE = "There was an error parsing the body"
    CANNOT_STREAM_N = "Cannot stream multiple responses."
    NOT_FOUND = "Not Found"
    METHOD_NOT_ALLOWED = "Method Not Allowed"

    TEXT_WITHOUT_TEXT = (
        '{where} has type "text" but no "text" string; add the text or remove the item.'
    )
    MEDIA_WITHOUT_URL = (
        '{where} has type "{kind}" but no "{kind}" object; '
        'add {{"{kind}": {{"url": "..."}}}} or remove the item.'
    )
    BAD_DATA_URI = (
        "{where}.{kind}.url is a data URI whose payload is not valid base64 data; "
        "encode the file with standard base64."
    )
    INPUT_AUDIO_WITHOUT_AUDIO = (
        '{where} has type "input_audio" but no "input_audio" object; add '
        '{{"input_audio": {{"data": "<base64>", "format": "wav"}}}} or remove the item.'
    )
    BAD_BASE64 = "{where} is not valid base64 data; encode the file with standard base64."
    MEDIA_TEXT_ONLY = (
        "{where} is {what}, but this server's model takes text only; start it with "
        "--mmproj PROJECTOR.gguf (the model's multimodal projector) to send {plural}, or send "
        "text content only."
    )
    MEDIA_KIND_UNSUPPORTED = (
        "{where} is {what}, but this server's model takes text and {takes} only (its --mmproj "
        "projector has no {kind} encoder); send text and {takes}."
    )
    VIDEO_UNSUPPORTED = (
        "{where} is a video, which this server does not take (llama.cpp's multimodal library "
        "reads video only through an external ffmpeg program); send frames of it as images."
    )
    TOO_MANY_MEDIA = (
        "The request has {count} images and audio clips but this server takes at most {limit} "
        "per request (--max-media-per-request); send fewer."
    )
    MEDIA_TOO_LARGE = (
        "{where}'s {kind} is larger than this server's limit of {limit} bytes "
        "(--max-media-bytes); send a smaller file."
    )
    MEDIA_FETCH_FAILED = "Could not fetch {where}'s {kind}: {reason}."
    MEDIA_READ_FAILED = "Could not read {where}'s {kind} from its file: {reason}."
    # the reason of a URL_OTHER (E13) and of a MEDIA_FETCH_FAILED (a redirect to such a host)
    NUMERIC_HOST = (
        "the host {host} ends in a number but is not an IPv4 address written as four decimal "
        "numbers (a.b.c.d)"
    )
    CONTENT_NULL = (
        "messages[{index}].content is null; give the message a content string "
        "(only an assistant message with tool_calls may omit it)."
    )
    TOOL_WITHOUT_FUNCTION = (
        'tools[{index}] has no "function"; give each tool a "function" object with '
        '"name" and "parameters" (and optionally "description").'
    )
    BAD_UNICODE = "{where} contains an unpaired UTF-16 surrogate; send valid Unicode text."
    NOT_POSITIVE = '"{name}" must be at least 1, got {value}.'
    OVER_LIMIT = '"{name}" is {value} but this server allows at most {limit}; lower it.'
    NOT_FINITE = '"{name}" must be a finite number, got {value}.'
    BELOW = '"{name}" must be at least {low}, got {value}.'
    NOT_ABOVE = '"{name}" must be greater than {low}, got {value}.'
    OUT_OF_RANGE = '"{name}" must be between {low} and {high}, got {value}.'
    LOGIT_BIAS_KEY = (
        '"logit_bias" keys must be token ids written as decimal integers of at most 9 digits, '
        "got {key}."
    )
    TOOL_CHOICE_INVALID = (
        '"tool_choice" must be "none", "auto", "required" or '
        '{{"type": "function", "function": {{"name": "..."}}}}, got {value}.'
    )
    TOOL_CHOICE_WITHOUT_TOOLS = (
        '"tool_choice": {value} forces a tool call but the request has no "tools"; '
        "add the functions or leave tool_choice out."
    )
    TOOL_CHOICE_UNKNOWN_FUNCTION = (
        '"tool_choice" names the function {name}, which is not in "tools" ({known}); '
        "name one of those."
    )
    SUFFIX_UNSUPPORTED = (
        '"suffix" is not supported (this server does no fill-in-the-middle); '
        "leave it out or send null."
    )
    BEST_OF_UNSUPPORTED = (
        '"best_of" is not supported; leave it out or set it equal to "n" ({n}), got {value}.'
    )
    EMPTY_PROMPT_LIST = (
        '"prompt" is an empty list; send a string, a list of strings, a list of token ids or '
        "a list of token-id lists."
    )
    EMPTY_TOKEN_PROMPT = '"{where}" is an empty list of token ids; send at least one token id.'
    UNKNOWN_TOKEN = (
        '"{where}" is the token id {token}, which is not in the vocabulary of this model '
        "(ids 0 to {last}); send ids from its tokenizer (POST /tokenize)."
    )
    TOKENIZE_NO_TEXT = (
        'The request has no text to tokenize; send {"prompt": "..."} '
        '(or llama-server\'s {"content": "..."}).'
    )
    TOKENIZE_TWO_TEXTS = (
        'The request has both "prompt" and "content"; send the text in one of them.'
    )
    TOO_MANY_CHOICES = (
        '"prompt" has {prompts} prompts and "n" is {n}: {total} choices, but this server '
        "allows at most {limit} per request; send fewer prompts or lower n."
    )
    COMPLETION_PROMPT_TOO_LONG = (
        "{where} is {n_prompt} tokens but the context window is {n_ctx} tokens; shorten it "
        "(it must leave room for at least one new token)."
    )
    JSON_SCHEMA_MISSING = (
        '"response_format" has type "json_schema" but no "json_schema"; add the schema object.'
    )
    JSON_SCHEMA_WITHOUT_SCHEMA = (
        '"response_format.json_schema" has no "schema" object; put the JSON schema of the '
        'answer there, or use {"type": "json_object"} for any JSON object.'
    )
    JSON_SCHEMA_UNUSABLE = (
        '"response_format.json_schema.schema" cannot be turned into a grammar: {error}; '
        'simplify the schema, or use {{"type": "json_object"}}.'
    )
    TOP_LOGPROBS_WITHOUT_LOGPROBS = (
        '"top_logprobs" requires "logprobs": true; set it or leave top_logprobs out.'
    )
    TOO_MANY_TEXTS = (
        '"messages" has {count} texts but this server scores at most {limit} per request; '
        "split the request."
    )
    EMPTY_INPUT_LIST = '"input" is an empty list; send at least one text or list of token ids.'
    EMPTY_TOKEN_INPUT = '"{where}" is an empty list of token ids; send at least one token.'
    TOO_MANY_INPUTS = (
        '"input" has {count} items but this server embeds at most {limit} per request; '
        "split the request."
    )
    DIMENSIONS_UNSUPPORTED = (
        '"dimensions" is {value} but this model\'s embeddings have {size} dimensions and '
        "cannot be shortened (its vectors were not trained to be cut); leave it out or send "
        "{size}."
    )
    EMBED_INPUT_TOO_LONG = (
        '"{where}" is {n_prompt} tokens but this server embeds at most {n_ctx} tokens per '
        "input; shorten it or split it."
    )
    MESSAGES_EMPTY = '"messages" is empty; send at least one user message.'
    MESSAGES_FIRST_NOT_USER = (
        'messages[0] has role "assistant"; the conversation must start with a user message.'
    )
    MESSAGES_PREFILL = (
        'The last message has role "assistant": this server does not continue a prefilled '
        "answer; end the conversation with a user message."
    )
    MESSAGE_EMPTY = "messages[{index}] has no content; every message needs some text."
    MESSAGE_BLOCK_UNSUPPORTED = (
        'messages[{index}].content[{number}] is a "{kind}" block, which this server does not '
        "take; send text, image, tool_use and tool_result blocks."
    )
    IMAGE_IN_ASSISTANT = (
        'messages[{index}].content[{number}] is an "image" block in a message of role '
        '"assistant"; images belong in user messages (or in tool_result blocks).'
    )
    IMAGE_FILE_SOURCE = (
        '{where} is an image with source type "file": this server '
        'keeps no files; send it as {{"type": "base64", ...}} or {{"type": "url", ...}}.'
    )
    MESSAGE_BLOCK_WRONG_ROLE = (
        'messages[{index}].content[{number}] is a "{kind}" block in a message of role "{role}"; '
        "tool_use blocks belong in assistant messages, tool_result blocks in user messages."
    )
    TOOL_RESULT_UNKNOWN_ID = (
        "messages[{index}].content[{number}] answers tool_use_id {id}, which no tool_use block "
        "of the previous assistant message has; give the id of the call it answers."
    )
    TOOL_CHOICE_NEEDS_NAME = (
        '"tool_choice" has type "tool" but no "name"; name the tool the answer must use.'
    )
    MESSAGES_TOOL_CHOICE_WITHOUT_TOOLS = (
        '"tool_choice" has type {value} but the request has no "tools"; add the tools or '
        "leave tool_choice out."
    )
    MESSAGES_TOOL_UNKNOWN = (
        '"tool_choice" names the tool {name}, which is not in "tools" ({known}); name one of those.'
    )
    SERVER_BUSY = "Server is busy: the request queue is full; retry later."
    MODEL_LOADING = "The model is still loading; retry in a few seconds."
    SHUTTING_DOWN = (
        "Server is shutting down and accepts no new requests; retry once it is back "
        "or on another instance."
    )
    PROMPT_TOO_LONG = (
        "The prompt is {n_prompt} tokens but the context window is {n_ctx} tokens; "
        "shorten the messages (it must leave room for at least one new token)."
    )
    TEXT_TOO_LONG = (
        "Text {index} (messages[{index}]) is {n_prompt} tokens but the context window is "
        "{n_ctx} tokens; shorten it or set max_length."
    )
    REQUEST_TOO_LARGE = "{what}: {got} exceeds this server's limit of {limit}; lower it."
    HOST_NOT_ALLOWED = (
        'This server does not answer to the host name "{host}" (a guard against DNS '
        "rebinding); reach it by an allowed name, or start it with --allowed-hosts {host}."
    )
    BODY_TOO_LARGE = (
        "The request body is larger than this server's limit of {limit} bytes; "
        "send a smaller request."
    )
    REQUEST_TIMEOUT = (
        "The request ran longer than this server's limit of {seconds:g} seconds and was "
        "stopped; lower max_tokens, or retry when the server is less busy."
    )
    STATELESS = (
        '"{field}" is not supported: this server is stateless and keeps no responses; '
        'send the whole conversation in "input" and leave {field} out.'
    )
    ITEM_UNSUPPORTED = (
        'input[{index}] has type "{type}", which this server does not support; send '
        '"message", "function_call" or "function_call_output" items.'
    )
    PART_UNSUPPORTED = (
        'input[{index}].content[{part}] has type "{type}", which this server does not '
        'support; send "input_text" (or "output_text") and "input_image" parts.'
    )
    SYSTEM_IMAGE = (
        "input[{index}].content[{part}] is an image in a {role} message; put images in user "
        "messages."
    )
    INPUT_IMAGE_FILE_ID = (
        'input[{index}].content[{part}] is an "input_image" with a "file_id": this server '
        'keeps no files; send the image in "image_url" as a data URL or an http(s) URL.'
    )
    INPUT_IMAGE_URL = (
        "input[{index}].content[{part}].image_url must be a data URL "
        '("data:image/png;base64,...") or an http(s) URL; send the image as one of those.'
    )
    ROLE_UNSUPPORTED = (
        'input[{index}] has role {role}; send "user", "assistant", "system" or "developer".'
    )
    SYSTEM_NOT_FIRST = (
        "input[{index}] is a {role} message after the conversation started; put system and "
        'developer messages first (or use "instructions").'
    )
    ITEM_MISSING_FIELD = 'input[{index}] ({type}) has no "{field}"; add it.'
    TOOL_UNSUPPORTED = 'tools[{index}] has type "{type}"; this server only calls "function" tools.'
    TOOL_WITHOUT_NAME = 'tools[{index}] has no "name"; give each function tool a name.'
    RESPONSES_TOOL_CHOICE_INVALID = (
        '"tool_choice" must be "none", "auto", "required" or '
        '{{"type": "function", "name": "..."}}, got {value}.'
    )
    TEXT_FORMAT_WITHOUT_SCHEMA = (
        '"text.format" has type "json_schema" but no "schema" object; put the JSON schema of '
        'the answer there, or use {"type": "json_object"} for any JSON object.'
    )
    LORA_FIELD = (
        'lora must be a list of {"id": <adapter id>, "scale": <number>} objects; '
        "GET /v1/models lists the adapters and their ids."
    )
    ADAPTER_ID_UNKNOWN = (
        "lora[{index}] names adapter id {id}, which is not loaded; GET /v1/models lists the "
        "adapters and their ids."
    )
    ADAPTER_UNKNOWN = "The LoRA adapter {name} is not loaded; GET /v1/models lists the adapters."
    MODEL_UNKNOWN = "The model {name} does not exist; this server has: {available}."
    MODEL_MISSING = "No model was named; this server has: {available}."
    ADAPTER_IN_USE = (
        "The LoRA adapter {name} is in use by {requests} running request(s); "
        "unload it once they have finished."
    )
    ADAPTERS_NOT_EMBEDDED = (
        "LoRA adapters apply to the served model, not to the --embedding-model that answers "
        "embeddings here; leave the adapter out."
    )
    LORA_NAME = "lora_name must have no spaces: requests choose the adapter by it in `model`."
    LORA_NAME_SERVED = (
        "lora_name {name} is the served model's name: every request for the model would run "
        "under the adapter; choose another name."
    )
    LORA_NAME_TAKEN = (
        "An adapter named {name} is already loaded; choose another lora_name, or unload it first."
    )
    LORA_NO_FOLDER = (
        "lora_path {path} cannot be loaded: this server has no LoRA folder to load adapters "
        "from at run time; start it with --lora-dir DIR."
    )
    LORA_OUTSIDE_FOLDER = (
        "lora_path {path} is outside the server's LoRA folder (--lora-dir); adapters load at "
        "run time only from files in it."
    )
    LORA_NOT_A_FILE = "lora_path {path} is no file in the server's LoRA folder."
    LORA_NOT_AN_ADAPTER = "lora_path {path} is not a LoRA adapter GGUF of the served model."
    LORA_FILE_LOADED = (
        "lora_path {path} is already loaded, as the adapter {loaded_as}; requests choose it by "
        "that name."
    )
    LORA_FULL = (
        "{limit} LoRA adapters are loaded, the most this server holds (--max-loras); unload "
        "one first."
    )
    RUNTIME_LORA_OFF = (
        "Loading and unloading LoRA adapters at run time is off; start the server with "
        "--allow-runtime-lora."
    )
    OLLAMA_MODEL_REQUIRED = "model is required"
    OLLAMA_MODEL_NOT_FOUND = "model '{name}' not found"
    OLLAMA_OPTION_TYPE = 'option "{name}" must be of type {kind}'
    OLLAMA_NO_THINKING = "{model} does not support thinking"
    OLLAMA_FORMAT_INVALID = 'invalid format: {value}; expected "json" or a valid JSON Schema object'
    OLLAMA_FORMAT_UNUSABLE = (
        '"format" cannot be turned into a grammar: {error}; simplify the schema, or use "json".'
    )
    OLLAMA_SUFFIX_UNSUPPORTED = (
        '"suffix" is not supported: this server does no fill-in-the-middle; leave it out.'
    )
    OLLAMA_TEMPLATE_UNSUPPORTED = (
        '"template" is not supported: prompts are rendered with the model\'s chat template '
        '(GGUF or --chat-template); leave it out, or send "raw": true with the prompt as text.'
    )
    OLLAMA_CONTEXT_UNSUPPORTED = (
        '"context" is not supported: this server keeps no token context between requests and '
        "sends none; send the whole conversation to /api/chat instead."
    )
    OLLAMA_RAW_WITH_EXTRAS = (
        '"raw" does not take "system" or "images" here: a raw prompt is text, sent as it is; '
        'leave them out, or leave "raw" out.'
    )
    OLLAMA_NO_TURNS = '"messages" holds only system messages; add a user message.'
    OLLAMA_IMAGES_NOT_USER = (
        "messages[{index}] is a {role} message with images; only user messages take images."
    )
    OLLAMA_NO_REGISTRY = (
        "{path} is not supported: this server reaches no model registry. Its models are GGUF "
        "files in its catalogue (--model, --models-dir, [models.NAME] tables in the config "
        "file); GET /api/tags lists them."
    )
    ENGINE_FAILED = "Internal Server Error"
    ENGINE_RESTARTED = (
        "The server's engine restarted after an internal error while running this request; "
        "retry it."
    )
